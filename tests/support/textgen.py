"""Small generated English-like text for tests (the project ships no third-party text)."""

import random

NOUNS = "cat dog bird fish horse farmer teacher child river stone tree house".split()
VERBS = "sees likes follows finds carries watches helps hears".split()
ADJS = "big small red old young green quiet fast".split()


def sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.choice(NOUNS), rng.choice(NOUNS)
        s = f"the {rng.choice(ADJS)} {a} {rng.choice(VERBS)} the {b}"
        if rng.random() < 0.3:
            s += f" near the {rng.choice(ADJS)} {rng.choice(NOUNS)}"
        out.append(s + " .")
    return out


def write_corpus(path, n_docs: int = 200, per_doc: int = 10, seed: int = 0) -> None:
    """CC-100 layout: one line per sentence, a blank line between documents."""
    lines = sentences(n_docs * per_doc, seed)
    with open(path, "w") as f:
        for d in range(n_docs):
            f.write("\n".join(lines[d * per_doc:(d + 1) * per_doc]) + "\n\n")
