"""Offline stand-ins for CoNLL-2003 and SQuAD: generated, learnable named entities and questions.

Tests, the ``ci`` regression profile and the benchmark cannot download data, so they use
sentences made here from templates and lists of real names, places and organisations
("Angela Merkel met officials of Siemens in Munich ."), tagged in IOB2, and biographies of
invented people with the questions they answer ("Where was Mara Lindqvist born?" ->
"Uppsala"). A working training loop learns both in a few epochs; a broken one cannot.

    make_ner_sentences(n, seed) -> [(tokens, tags)]     write_conll(path, sentences)
    make_squad_articles(n, seed, ...) -> SQuAD "data"   write_squad(path, articles)

``people_per_context`` joins several biographies into one context, so that a context is
longer than a model's window and some answers lie in its second window;
``unanswerable`` adds SQuAD 2.0 questions whose answer is not in the text.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

PEOPLE = ["Angela Merkel", "Nelson Mandela", "Marie Curie", "Serena Williams", "Lionel Messi", "Kofi Annan",
          "Jacinda Ardern", "Emmanuel Macron", "Ada Lovelace", "Haruki Murakami", "Gonzalez", "Yamamoto",
          "Clinton", "Boris Johnson", "Greta Thunberg", "Pele", "Frida Kahlo", "Ban Ki-moon"]
PLACES = ["Paris", "New York", "Berlin", "South Africa", "Tokyo", "Buenos Aires", "Nairobi", "Canada",
          "Rio de Janeiro", "Munich", "Geneva", "London", "Mexico City", "Sydney", "Cairo", "Brussels"]
ORGANISATIONS = ["Reuters", "Siemens", "Toyota", "European Commission", "Bank of England", "Real Madrid",
                 "Greenpeace", "Microsoft", "World Health Organization", "United Nations", "Volkswagen",
                 "Associated Press", "Red Cross", "Deutsche Bank"]
MISCELLANEOUS = ["German", "French", "Nobel", "Olympic", "Japanese", "Brazilian", "World Cup", "Australian",
                 "European", "Grammy"]
SLOTS = {"PER": PEOPLE, "LOC": PLACES, "ORG": ORGANISATIONS, "MISC": MISCELLANEOUS}
# Pre-tokenized as CoNLL-2003 is: punctuation apart, one token per space.
TEMPLATES = [
    "{PER} visited {LOC} on Monday .",
    "{ORG} opened a new office in {LOC} .",
    "{PER} , who works for {ORG} , spoke to reporters in {LOC} .",
    "The {MISC} delegation in {LOC} welcomed {PER} .",
    "{PER} won the {MISC} prize last year .",
    "Shares of {ORG} rose 3 percent after {PER} announced the deal .",
    "{LOC} beat {LOC} 2-1 in the final .",
    "{PER} met {PER} in {LOC} to discuss trade .",
    "{ORG} said on Tuesday it would cut 500 jobs .",
    "Officials in {LOC} said the talks with {ORG} would resume next week .",
    "It was a quiet day on the market .",
    "A spokesman for {ORG} declined to comment .",
    "{PER} told {ORG} that the {MISC} team would travel to {LOC} .",
    "Rain delayed the start of play for two hours .",
]


def make_ner_sentences(n: int, seed: int = 0) -> list[tuple[list[str], list[str]]]:
    """``n`` sentences as (tokens, IOB2 tags) from the templates and entity lists."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        template = TEMPLATES[i % len(TEMPLATES)] if i < len(TEMPLATES) else rng.choice(TEMPLATES)
        tokens, tags = [], []
        for piece in template.split():
            kind = piece[1:-1] if piece.startswith("{") and piece.endswith("}") else None
            if kind is None:
                tokens.append(piece)
                tags.append("O")
                continue
            words = rng.choice(SLOTS[kind]).split()
            tokens += words
            tags += [f"B-{kind}"] + [f"I-{kind}"] * (len(words) - 1)
        out.append((tokens, tags))
    return out


def write_conll(path: str | Path, sentences: list[tuple[list[str], list[str]]], docs_of: int = 10) -> Path:
    """A CoNLL file ("token tag" per line, an empty line after each sentence), with a
    ``-DOCSTART-`` line before every ``docs_of`` sentences, as CoNLL-2003 has."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, (tokens, tags) in enumerate(sentences):
        if i % docs_of == 0:
            lines += ["-DOCSTART- O", ""]
        lines += [f"{token} {tag}" for token, tag in zip(tokens, tags, strict=True)] + [""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


# --------------------------------------------------------------------------------- SQuAD
FIRST = ["Mara", "Tomas", "Ines", "Oskar", "Leila", "Piotr", "Aiko", "Rafael", "Nadia", "Henrik", "Sofia",
         "Emeka", "Lucia", "Arjun", "Greta", "Mateo"]
LAST = ["Lindqvist", "Novak", "Okafor", "Brandt", "Haddad", "Kowalski", "Tanaka", "Moreau", "Petrova",
        "Svensson", "Rossi", "Mensah", "Ferreira", "Iyer", "Keller", "Duarte"]
CITIES = ["Uppsala", "Krakow", "Lagos", "Hamburg", "Beirut", "Gdansk", "Osaka", "Lyon", "Sofia", "Bergen",
          "Turin", "Accra", "Porto", "Pune", "Zurich", "Seville"]
FIELDS = ["chemistry", "physics", "botany", "economics", "linguistics", "geology", "astronomy", "medicine"]
SCHOOLS = ["the University of Vienna", "Trinity College", "the Sorbonne", "Leiden University",
           "the University of Toronto", "Kyoto University", "Heidelberg University", "McGill University"]
AWARDS = ["Royal Medal", "Wolf Prize", "Lorentz Medal", "Crafoord Prize", "Copley Medal", "Abel Prize"]


def _person(rng: random.Random) -> dict:
    city, moved = rng.sample(CITIES, 2)
    return {"name": f"{rng.choice(FIRST)} {rng.choice(LAST)}", "city": city, "year": str(rng.randint(1850, 1990)),
            "field": rng.choice(FIELDS), "school": rng.choice(SCHOOLS), "moved": moved,
            "years": str(rng.randint(3, 30)), "award": f"the {rng.choice(AWARDS)}"}


# A biography as text pieces and slots: the answer of a slot is where the slot is filled in.
BIOGRAPHY = ["name", " was born in ", "city", " in ", "year", ". After school, ", "name", " studied ", "field",
             " at ", "school", " and later moved to ", "moved", ", where the work went on for ", "years",
             " years. Late in that career came ", "award", "."]
QUESTIONS = {"city": "Where was {name} born?", "year": "In which year was {name} born?",
             "field": "What did {name} study?", "school": "Where did {name} study {field}?",
             "moved": "Which city did {name} move to?", "award": "Which award did {name} receive?"}


def _biography(p: dict) -> tuple[str, list[tuple[str, str, int]]]:
    """A paragraph about ``p`` and its (question, answer, answer start) triples."""
    text, starts = "", {}
    for piece in BIOGRAPHY:
        if piece in p:
            starts.setdefault(piece, len(text))
            piece = p[piece]
        text += piece
    return text, [(q.format(**p), p[slot], starts[slot]) for slot, q in QUESTIONS.items()]


def make_squad_articles(n_contexts: int, seed: int = 0, *, people_per_context: int = 1,
                        questions_per_context: int = 3, unanswerable: int = 0) -> list[dict]:
    """SQuAD's ``data`` list: ``n_contexts`` paragraphs of biographies with their questions.

    ``unanswerable``: that many questions per context about someone not in it (SQuAD 2.0,
    ``is_impossible``). Answer starts point at the answer's occurrence in its own biography.
    """
    rng = random.Random(seed)
    articles = []
    for c in range(n_contexts):
        people, names = [], set()
        while len(people) < people_per_context:
            person = _person(rng)
            if person["name"] not in names:
                names.add(person["name"])
                people.append(person)
        context, qas = "", []
        for person in people:
            text, triples = _biography(person)
            offset = len(context) + (1 if context else 0)
            context = f"{context} {text}" if context else text
            for question, answer, start in rng.sample(triples, min(questions_per_context, len(triples))):
                qas.append({"id": f"q{c:04d}-{len(qas)}", "question": question,
                            "answers": [{"text": answer, "answer_start": offset + start}], "is_impossible": False})
        for _ in range(unanswerable):
            stranger = _person(rng)
            while stranger["name"] in names:
                stranger = _person(rng)
            question = rng.choice(_biography(stranger)[1])[0]
            qas.append({"id": f"q{c:04d}-{len(qas)}", "question": question, "answers": [], "is_impossible": True})
        articles.append({"title": people[0]["name"], "paragraphs": [{"context": context, "qas": qas}]})
    return articles


def write_squad(path: str | Path, articles: list[dict], version: str = "v1.1") -> Path:
    """A SQuAD-format JSON file (``{"version", "data"}``), pretty-printed (lines to point at)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": version, "data": articles}, indent=1) + "\n", encoding="utf-8")
    return path
