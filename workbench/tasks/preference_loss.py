"""The preference losses on a batch of pairs, from the answers' log-probabilities.

Every loss here reads, per pair, the summed log-probability of the chosen and of the
rejected answer's tokens under the policy (the model being trained) and their token
counts; DPO and IPO also read the same under the reference model (the model before this
training: with LoRA the same weights with the adapter switched off). The formulas are
those of the papers, written as TRL writes them, so that a run here and a TRL run of the
same settings optimize the same thing:

- ``dpo`` (Rafailov et al. 2023): ``-log sigmoid(beta * ((pc - rc) - (pr - rr)))``, sums of
  log-probabilities. At the start the policy equals the reference and the loss is ln 2.
- ``ipo`` (Azar et al. 2023): ``(h - 1 / (2 beta))^2`` with ``h`` the same difference of
  log-ratios on per-token *means* (TRL's choice): a bounded target instead of DPO's
  push towards infinite margins.
- ``simpo`` (Meng et al. 2024), reference-free: ``-log sigmoid(beta * (mc - mr) - gamma)`` on
  per-token means ``mc``, ``mr``; ``gamma`` (``simpo_gamma``) is the target margin.
- ``orpo`` (Hong et al. 2024), reference-free, with the supervised loss built in:
  ``-mc - beta * log sigmoid(log odds(mc) - log odds(mr))``, ``odds(m) = e^m / (1 - e^m)``.
  TRL averages the supervised term over the batch's chosen tokens; here it is averaged per
  pair, like every other term (the engine weights micro-batches by pairs).

Rewards (what ``eval_reward_accuracy`` counts): ``beta * (policy - reference)`` summed
log-probabilities for DPO and IPO (the implicit reward of the DPO paper), ``beta`` times the
per-token mean for the reference-free losses. Everything is computed in fp32: under fp16 the
differences of sums of hundreds of log-probabilities lose their digits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

REFERENCE_FREE = ("simpo", "orpo")


@dataclass
class PairLogps:
    """Per pair: summed log-probabilities of the answers' tokens, and the token counts."""

    chosen: torch.Tensor  # [P]
    rejected: torch.Tensor
    chosen_tokens: torch.Tensor
    rejected_tokens: torch.Tensor

    def means(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.chosen / self.chosen_tokens.clamp(min=1), self.rejected / self.rejected_tokens.clamp(min=1)


def needs_reference(loss: str) -> bool:
    return loss not in REFERENCE_FREE


def pair_losses(loss: str, policy: PairLogps, reference: PairLogps | None, *, beta: float,
                gamma: float = 0.5) -> torch.Tensor:
    """The loss of each pair ([P], fp32) under ``loss`` (dpo | ipo | simpo | orpo)."""
    if loss == "dpo":
        h = (policy.chosen - reference.chosen) - (policy.rejected - reference.rejected)
        return -F.logsigmoid(beta * h.float())
    if loss == "ipo":
        (pc, pr), (rc, rr) = policy.means(), reference.means()
        h = (pc - rc) - (pr - rr)
        return (h.float() - 1 / (2 * beta)) ** 2
    mc, mr = (m.float() for m in policy.means())
    if loss == "simpo":
        return -F.logsigmoid(beta * (mc - mr) - gamma)
    if loss == "orpo":
        # log(1 - e^m) as log(-expm1(m)): exact near m = 0 (an answer the model is sure of), where
        # log1p(-exp(m)) loses every digit; m is clamped just below 0 for the same reason.
        def log_odds(m):
            m = m.clamp(max=-1e-6)
            return m - torch.log(-torch.expm1(m))

        return -mc - beta * F.logsigmoid(log_odds(mc) - log_odds(mr))
    raise ValueError(f"unknown preference loss {loss!r}")


def rewards(loss: str, policy: PairLogps, reference: PairLogps | None, *, beta: float
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(reward of each chosen answer, of each rejected one), as described in the module's docstring."""
    if needs_reference(loss):
        return beta * (policy.chosen - reference.chosen).float(), beta * (policy.rejected - reference.rejected).float()
    mc, mr = policy.means()
    return beta * mc.float(), beta * mr.float()


def reward_accuracy(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """Per pair: 1 when the chosen answer's reward is the higher, 0 when lower, 0.5 on a tie.

    A tie is a coin flip, not a miss: at the start of a DPO run every reward is exactly 0, and
    the accuracy reads 0.5 (chance) rather than TRL's 0 (which counts ties as misses).
    """
    return (chosen > rejected).float() + 0.5 * (chosen == rejected).float()
