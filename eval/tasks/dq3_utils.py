"""Document processing for the two tasks that a Jinja template cannot express clearly.

HellaSwag: contexts and endings come from WikiHow and ActivityNet and carry bracketed markup such as
"[header]" or "[step]"; the prompt is "<activity label>: <context>" and the markup is cleaned away.
WinoGrande: the two options are scored as *contexts* (the sentence up to the blank, with the option filled in)
against the same continuation (the rest of the sentence), so the gold answer is a context index.
"""

import re

import datasets

_BRACKETED = re.compile(r"\[[^\]]*\]")


def _clean_wikihow(text: str) -> str:
    """Drop WikiHow's bracketed markup; a "[title]" marker ends a sentence."""
    text = text.strip().replace(" [title]", ". ")
    return _BRACKETED.sub("", text).replace("  ", " ")


def _hellaswag_prompt(doc: dict) -> dict:
    context = f"{doc['ctx_a']} {doc['ctx_b'].capitalize()}"
    return {
        "query": _clean_wikihow(f"{doc['activity_label']}: {context}"),
        "choices": [_clean_wikihow(ending) for ending in doc["endings"]],
        "gold": int(doc["label"]),
    }


def hellaswag_docs(dataset: datasets.Dataset) -> datasets.Dataset:
    """Add `query`, `choices` and `gold` to each HellaSwag document."""
    return dataset.map(_hellaswag_prompt)


def winogrande_gold(doc: dict) -> int:
    """The index of the correct option ("1" or "2" in the dataset)."""
    return int(doc["answer"]) - 1


def winogrande_contexts(doc: dict) -> list[str]:
    """The sentence up to the blank, once with each option filled in."""
    before_blank = doc["sentence"][: doc["sentence"].index("_")]
    return [before_blank + doc["option1"], before_blank + doc["option2"]]


def winogrande_continuation(doc: dict) -> str:
    """The rest of the sentence after the blank, scored after each context."""
    return doc["sentence"][doc["sentence"].index("_") + 1 :].strip()
