"""Writes the tests' text corpus: 160 KB of English-like sentences drawn from a fixed seed.

The tests' numbers depend on their data, so the data is generated, the same on every machine,
instead of read from files that change (such as this project's own sources).
"""
import os
import random
import sys

SUBJECTS = ["the model", "a rank", "every shard", "the optimizer", "one unit", "the gradient",
            "a worker", "the cluster", "each layer", "the scheduler"]
VERBS = ["gathers", "reduces", "scatters", "frees", "computes", "waits for", "sends", "keeps",
         "casts", "checks"]
OBJECTS = ["its parameters", "the next block", "a flat buffer", "the loss", "sixteen bytes",
           "the full weights", "one chunk", "the running mean", "a checkpoint", "the batch"]
ENDINGS = [".", ".", ".", "!", "?", ", then stops.", " before backward.", " after forward."]


def sentence(rng):
    text = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}{rng.choice(ENDINGS)}"
    return text[0].upper() + text[1:]


def corpus(size, seed=1234):
    rng = random.Random(seed)
    parts, length = [], 0
    while length < size:
        line = " ".join(sentence(rng) for _ in range(rng.randint(1, 4))) + "\n"
        parts.append(line)
        length += len(line)
    return "".join(parts)[:size]


if __name__ == "__main__":
    os.makedirs(os.path.dirname(os.path.abspath(sys.argv[1])), exist_ok=True)
    with open(sys.argv[1], "w", encoding="ascii") as out:
        out.write(corpus(160 * 1024))
