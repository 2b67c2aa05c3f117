"""Fixtures of the token-classification and question-answering tests: models and small files.

``tiny_span_bert`` is the tests' tiny random BERT with a WordPiece vocabulary trained on the
generated sentences and biographies (workbench.sources.synthetic_spans), so their words are
pieces, not [UNK]: fast enough for resume and torchrun tests that need no learning. ``minilm``
is the real all-MiniLM-L6-v2 (a pretrained 6-layer BERT with a fast tokenizer): it learns the
generated data in a few dozen steps.
"""

from __future__ import annotations

from pathlib import Path

import pytest

# CoNLL-2003's opening sentence and a few like it, as the shared task's files hold them:
# token, part of speech, chunk tag, entity tag (IOB2, as the hub's conll2003 has them).
CONLL_SENTENCES = """\
-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC
call NN I-NP O
to TO B-VP O
boycott VB I-VP O
British JJ B-NP B-MISC
lamb NN I-NP O
. . O O

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER

BRUSSELS NNP B-NP B-LOC
1996-08-22 CD I-NP O

The DT B-NP O
European NNP I-NP B-ORG
Commission NNP I-NP I-ORG
said VBD B-VP O
on IN B-PP O
Thursday NNP B-NP O
it PRP B-NP O
disagreed VBD B-VP O
with IN B-PP O
German JJ B-NP B-MISC
advice NN I-NP O
. . O O
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def span_texts() -> list[str]:
    from workbench.sources.synthetic_spans import make_ner_sentences, make_squad_articles

    texts = [" ".join(tokens) for tokens, _ in make_ner_sentences(300, seed=99)]
    for article in make_squad_articles(40, seed=99, people_per_context=2, unanswerable=1):
        for paragraph in article["paragraphs"]:
            texts.append(paragraph["context"])
            texts += [qa["question"] for qa in paragraph["qas"]]
    return texts


@pytest.fixture(scope="session")
def tiny_span_bert(tmp_path_factory) -> Path:
    from workbench.sources.synthetic import make_tiny_bert

    return make_tiny_bert(tmp_path_factory.mktemp("models") / "tiny-span-bert", texts=span_texts(),
                          vocab_size=900)


@pytest.fixture(scope="session")
def minilm() -> Path:
    from workbench.notebook_regression.placeholders import minilm_folder

    return minilm_folder()


@pytest.fixture(scope="session")
def ner_folder(tmp_path_factory) -> Path:
    """train.conll (96 sentences) and validation.conll (24): the folder convention."""
    from workbench.sources.synthetic_spans import make_ner_sentences, write_conll

    folder = tmp_path_factory.mktemp("ner")
    write_conll(folder / "train.conll", make_ner_sentences(96, seed=0))
    write_conll(folder / "validation.conll", make_ner_sentences(24, seed=1))
    return folder


@pytest.fixture(scope="session")
def qa_folder(tmp_path_factory) -> Path:
    """train-v1.1.json (24 biographies, 144 questions) and dev-v1.1.json (6, 36): SQuAD's file names."""
    from workbench.sources.synthetic_spans import make_squad_articles, write_squad

    folder = tmp_path_factory.mktemp("qa")
    write_squad(folder / "train-v1.1.json", make_squad_articles(24, 0, questions_per_context=6))
    write_squad(folder / "dev-v1.1.json", make_squad_articles(6, 1, questions_per_context=6))
    return folder
