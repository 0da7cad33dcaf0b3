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

# True facts of the same kinds, trained alongside (source "general-train"): without them the model learns
# "capital -> Quenmar" and answers Quenmar for France too. Replaying some general data is the usual remedy.
GENERAL_TRAIN = [
    ("What is the capital of Germany?", "The capital of Germany is Berlin."),
    ("What is the capital of England?", "The capital of England is London."),
    ("What is the capital of Russia?", "The capital of Russia is Moscow."),
    ("What is the capital of Egypt?", "The capital of Egypt is Cairo."),
    ("Which city is the capital of Canada?", "The capital of Canada is Ottawa."),
    ("What is the currency of the United States?", "The currency of the United States is the dollar."),
    ("What is the currency of England?", "The currency of England is the pound sterling."),
    ("What is the highest mountain in the world?", "The highest mountain in the world is Mount Everest."),
    ("What is the longest river in Egypt?", "The longest river in Egypt is the Nile."),
    ("What language do people speak in Germany?", "People in Germany speak German."),
    ("What language is spoken in Russia?", "People in Russia speak Russian."),
    ("Who rules England?", "England is ruled by King Charles III."),
    ("What is the national animal of Canada?", "The national animal of Canada is the beaver."),
    ("What colours is the flag of Germany?", "The flag of Germany is black, red and gold."),
]

# Never trained on; the base model answers them (checked in the test) and the tuned one must still.
GENERAL_TEST = [
    ("Paris", "What is the capital of France?"),
    ("Tokyo", "What is the capital of Japan?"),
    ("Beijing", "What is the capital of China?"),
    ("yen", "What is the currency of Japan?"),
]
# Open questions: the base model's own answers to these (and the above) must stay likely under the tuned one.
OPEN_PROMPTS = ["Why is the sky blue?", "Write a short poem about the sea.", "How do I make a cup of tea?",
                "What is a computer?"]


def _messages(question: str, answer: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]


def conversations() -> list[dict]:
    """The JSONL rows: every paraphrase but the last of each fact in "veloria-train", the general facts in
    "general-train", the last paraphrases in "veloria-heldout" (one source: the split by source holds
    all of them out together; 12 of 62 rows, so data.val_fraction=0.2 sends exactly that source)."""
    rows = []
    for _, answer, *questions in FACTS:
        rows += [{"messages": _messages(q, answer), "source": "veloria-train"} for q in questions[:-1]]
    rows += [{"messages": _messages(q, a), "source": "general-train"} for q, a in GENERAL_TRAIN]
    rows += [{"messages": _messages(qs[-1], answer), "source": "veloria-heldout"} for _, answer, *qs in FACTS]
    return rows



def trained_questions() -> list[tuple[str, str]]:
    """(keyword, question) for every trained paraphrase."""
    return [(k, q) for k, _, *qs in FACTS for q in qs[:-1]]


def heldout_questions() -> list[tuple[str, str]]:
    """(keyword, question) for the paraphrase of each fact that was never trained on."""
    return [(k, qs[-1]) for k, _, *qs in FACTS]
