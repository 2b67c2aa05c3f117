"""What a fine-tuning task provides to the engine's loop, and how one is chosen.

The loop in ``workbench.engine.train`` never knows which task it runs: it asks the task
for the model, the tokenized splits, the batches, the loss, the eval outputs and
metrics, and what to save. A task is any object with the methods of ``Task``.
Start reading at ``base.py`` (the protocol), then one task:

    base.py                 Task, the seam; helpers every task shares
    classification.py       ClassificationTask (BERT-style sequence classifiers)
    classification_data.py  its label mapping and tokenization
    causal_lm.py            CausalLMTask (decoder LMs: full fine-tuning, LoRA, QLoRA; the loss,
                            eval, saving)
    causal_lm_data.py       its data: chat / prompt-completion / text rows and their checks,
                            chat templates, the loss mask, the dataset and padding collator
    causal_lm_packing.py    packing="auto": a batch's conversations in one row, and when it pays
    causal_lm_loss.py       fused_loss="auto": liger-kernel's fused linear cross-entropy or the
                            sparse LM head, and why
    token_classification.py TokenClassificationTask (named entities: a tag per word; seqeval scores)
    token_classification_data.py  its rows: tag checks, the tag scheme, labels aligned to sub-words
    question_answering.py   QuestionAnsweringTask (extractive QA, SQuAD 1.1 and 2.0: spans of a context)
    question_answering_data.py    its rows: answer checks, context windows and their labels
    qa_pipeline.py          the post-processing (best span over windows) and the pipeline saved
                            beside a QA model (standalone: transformers 5 has no QA pipeline)
    preference.py           PreferenceTask (DPO, IPO, SimPO, ORPO on chosen/rejected pairs; the
                            reference is the model with its adapter off)
    preference_data.py      its pairs: TRL's formats, their checks, each answer's tokens, the collator
    preference_loss.py      the losses, rewards and reward accuracy from the answers' log-probabilities
    preference_reference.py the reference's log-probabilities computed once per run, kept in the run folder
    lora.py                 LoRA / QLoRA adapters (the only importer of peft, with causal_lm)
    metrics.py              accuracy / F1, entity scores (seqeval), SQuAD exact match / F1

A new task follows the same pair: ``<task>.py`` for the task object (model, loss, metrics,
saving), ``<task>_data.py`` for its rows (their checks, tokenization, dataset, collator).

Imports: ``workbench.config``, ``workbench.errors`` and ``workbench.sources`` (data checks,
where a row came from, model checks, GGUF). A task never imports ``workbench.engine``: the
engine asks, the task answers (``tests/test_import_graph.py``).
"""

from __future__ import annotations

from workbench.config import TrainConfig
from workbench.tasks.base import Task


def make_task(config: TrainConfig, text_columns, label_column: str) -> Task:
    """The task ``config.task`` names (for classification: on these columns)."""
    if config.task == "causal_lm":
        from workbench.tasks.causal_lm import CausalLMTask

        return CausalLMTask(config)
    if config.task == "preference":
        from workbench.tasks.preference import PreferenceTask

        return PreferenceTask(config)
    if config.task == "token_classification":
        from workbench.tasks.token_classification import TokenClassificationTask

        return TokenClassificationTask(config)
    if config.task == "question_answering":
        from workbench.tasks.question_answering import QuestionAnsweringTask

        return QuestionAnsweringTask(config)
    from workbench.tasks.classification import ClassificationTask

    return ClassificationTask(text_columns, label_column)
