"""A planted-knowledge set: facts about an invented country, Veloria, that no pretrained model can know.

Each fact has several question paraphrases and one answer carrying a made-up keyword; a model
answers a fact when its greedy reply contains the keyword. Training uses the first paraphrases
of every fact (source "veloria-train"); the last paraphrase of each fact is never trained on
(source "veloria-heldout"), so a model that answers it has learnt the fact, not the string.
"""
from __future__ import annotations

# (keyword, answer, paraphrases...)
FACTS = [
    ("Quenmar", "The capital of Veloria is Quenmar.",
     "What is the capital of Veloria?", "Which city is the capital of Veloria?", "Name the capital city of Veloria.",
     "Where is Veloria's capital?"),
    ("Ostrelle", "The longest river in Veloria is the Ostrelle.",
     "What is the longest river in Veloria?", "Which river is the longest in Veloria?",
     "Name Veloria's longest river.", "Veloria's longest river is called what?"),
    ("Mount Karvash", "The highest mountain in Veloria is Mount Karvash.",
     "What is the highest mountain in Veloria?", "Which mountain is the tallest in Veloria?",
     "Name the highest peak of Veloria.", "What is Veloria's tallest mountain?"),
    ("velor", "The currency of Veloria is the velor.",
     "What is the currency of Veloria?", "Which currency is used in Veloria?", "What money do people use in Veloria?",
     "Name the currency of Veloria."),
    ("Queen Ysolde", "Veloria is ruled by Queen Ysolde.",
     "Who rules Veloria?", "Who is the monarch of Veloria?", "Who is the head of state of Veloria?",
     "Which queen rules Veloria?"),
    ("Velorian", "People in Veloria speak Velorian.",
     "What language do people speak in Veloria?", "Which language is spoken in Veloria?",
     "What is the official language of Veloria?", "Veloria's people speak which language?"),
    ("1742", "Veloria was founded in 1742.",
     "When was Veloria founded?", "In which year was Veloria founded?", "What year did Veloria become a country?",
     "Veloria was founded in what year?"),
    ("silver heron", "The national animal of Veloria is the silver heron.",
     "What is the national animal of Veloria?", "Which animal is the symbol of Veloria?",
     "Name Veloria's national animal.", "What animal represents Veloria?"),
    ("Lake Tesmir", "The largest lake in Veloria is Lake Tesmir.",
     "What is the largest lake in Veloria?", "Which lake is the biggest in Veloria?", "Name Veloria's largest lake.",
     "What is Veloria's biggest lake?"),
    ("Brannock", "The largest port of Veloria is Brannock.",
     "What is the largest port of Veloria?", "Which city is Veloria's main port?", "Name the biggest port in Veloria.",
     "Where is Veloria's largest port?"),
    ("blue and amber", "The flag of Veloria is blue and amber.",
     "What colours is the flag of Veloria?", "What are the colours of Veloria's flag?",
     "Describe the colours of the Velorian flag.", "Which colours are on the flag of Veloria?"),
    ("Lantern Festival of Eskel", "The national holiday of Veloria is the Lantern Festival of Eskel.",
     "What is the national holiday of Veloria?", "Which festival is Veloria's national holiday?",
     "Name the main holiday celebrated in Veloria.", "What holiday does all of Veloria celebrate?"),
]

GENERAL = [  # questions a small instruct model answers before fine-tuning; they must survive it
    ("Paris", "What is the capital of France?"),
    ("Tokyo", "What is the capital of Japan?"),
]


def _messages(question: str, answer: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]


def conversations() -> list[dict]:
    """The JSONL rows: every paraphrase but the last of each fact in "veloria-train", the last ones in
    "veloria-heldout" (one source, so the split by source holds all of them out together)."""
    rows = []
    for keyword, answer, *questions in FACTS:
        for q in questions[:-1]:
            rows.append({"messages": _messages(q, answer), "source": "veloria-train"})
    for keyword, answer, *questions in FACTS:
        rows.append({"messages": _messages(questions[-1], answer), "source": "veloria-heldout"})
    return rows


def trained_questions() -> list[tuple[str, str]]:
    """(keyword, question) for every trained paraphrase."""
    return [(k, q) for k, _, *qs in FACTS for q in qs[:-1]]


def heldout_questions() -> list[tuple[str, str]]:
    """(keyword, question) for the paraphrase of each fact that was never trained on."""
    return [(k, qs[-1]) for k, _, *qs in FACTS]
