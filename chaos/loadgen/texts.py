"""The texts a load run sends: a file, one text per line, or a built-in mix of review-like texts.

The built-in mix is generated from a seed, so it needs no network and no data files, and the same seed gives the
same texts. Lengths are skewed the way review text usually is: mostly short, with a long tail.

| share | kind   | sentences | words  | tokens (default model's tokenizer, seed 0) |
| ----: | ------ | --------: | -----: | ------------------------------------------ |
|   50% | short  |         1 |  3-16  | 7-21, median 13                            |
|   35% | medium |       2-4 |  6-53  | 13-62, median 35                           |
|   15% | long   |      6-14 | 37-141 | 53-174, median 108                         |

Over the whole mix: 35 tokens on average, median 19, longest 174 (under the server's default 256, so nothing
is truncated).

Sentences come from templates about films, products, restaurants and apps, with positive, negative and mixed
wording, so a classifier's scores spread out rather than collapsing on one label.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

MIX_SIZE = 2000  # distinct texts in the built-in mix; requests cycle through them
# (share, kind, fewest sentences, most sentences)
SHAPES: tuple[tuple[float, str, int, int], ...] = ((0.50, "short", 1, 1), (0.35, "medium", 2, 4),
                                                   (0.15, "long", 6, 14))

_SUBJECTS = {
    "film": ("the plot", "the acting", "the soundtrack", "the ending", "the director", "the dialogue", "the pacing",
             "the lead", "the cinematography", "the script", "the second act", "the villain"),
    "product": ("the battery", "the screen", "the build quality", "the price", "the charger", "the case",
                "the camera", "the keyboard", "the packaging", "the speaker", "the manual", "the strap"),
    "restaurant": ("the service", "the pasta", "the dessert", "the waiter", "the wine list", "the portions",
                   "the bread", "the music", "the booking", "the terrace", "the coffee", "the menu"),
    "app": ("the update", "the login", "the sync", "the interface", "the search", "the notifications",
            "the dark mode", "the support team", "the onboarding", "the subscription", "the offline mode",
            "the export"),
}
_GOOD = ("great", "excellent", "lovely", "solid", "surprisingly good", "charming", "reliable", "smooth", "sharp",
         "generous", "well made", "worth every penny", "a delight", "fast", "clever")
_BAD = ("awful", "disappointing", "flimsy", "slow", "overpriced", "boring", "clumsy", "broken", "forgettable",
        "a mess", "painfully dull", "cheap", "confusing", "buggy", "bland")
_ADVERBS = ("really", "honestly", "frankly", "quite", "a bit", "absolutely", "somewhat", "truly", "just")
_OPENERS = ("Overall", "To be fair", "Honestly", "In the end", "After a week", "On balance", "Still", "Sadly",
            "Thankfully", "For the price")
_TEMPLATES = (
    "{Subject} was {adverb} {quality}.",
    "{Subject} is {quality}, but {subject2} is {quality2}.",
    "{Opener}, {subject} felt {quality}.",
    "I expected more from {subject}; it was {quality}.",
    "Loved {subject}, {adverb} {quality}.",
    "{Subject} could have been {quality2} if {subject2} were not so {quality}.",
    "Would not recommend: {subject} is {quality}.",
    "{Opener}, I would come back for {subject} alone.",
    "Five stars for {subject}, {quality} from start to finish.",
    "Two stars, because {subject} was {quality} and {subject2} was {quality2}.",
    "My friends thought {subject} was {quality}, and I {adverb} agree.",
    "{Subject}? {Quality}.",
)


def _sentence(rng: random.Random, topic: str) -> str:
    subject, subject2 = rng.sample(_SUBJECTS[topic], 2)
    quality = rng.choice(_GOOD if rng.random() < 0.5 else _BAD)
    quality2 = rng.choice(_GOOD if rng.random() < 0.5 else _BAD)
    text = rng.choice(_TEMPLATES).format(
        subject=subject, Subject=subject.capitalize(), subject2=subject2, quality=quality, Quality=quality.capitalize(),
        quality2=quality2, adverb=rng.choice(_ADVERBS), Opener=rng.choice(_OPENERS),
    )
    return text


def default_mix(seed: int = 0, size: int = MIX_SIZE) -> tuple[str, ...]:
    """`size` review-like texts with the length mix in this module's docstring, the same for the same seed."""
    rng = random.Random(seed)
    texts: list[str] = []
    for _ in range(size):
        _share, _kind, fewest, most = rng.choices(SHAPES, weights=[shape[0] for shape in SHAPES])[0]
        topic = rng.choice(tuple(_SUBJECTS))  # one text reviews one thing
        texts.append(" ".join(_sentence(rng, topic) for _ in range(rng.randint(fewest, most))))
    return tuple(texts)


def read_texts(path: Path, label: str | None = None) -> tuple[str, ...]:
    """One text per line, or JSON lines with a "text" field (and a "label" one, which `label` selects by: the
    held-out files glassbox writes); blank lines are skipped. Raises ValueError when nothing is left, or the file is
    not text."""
    try:
        content = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:  # a binary file given by mistake: say so, not where the decoder stopped
        raise ValueError(f"{path} is not UTF-8 text (one text per line)") from None
    lines = [line for line in content.splitlines() if line.strip()]
    if lines and lines[0].lstrip().startswith("{"):
        texts = tuple(_labelled(lines, path, label))
    elif label is not None:
        raise ValueError(f"{path} has one text a line and no labels to keep {label!r} by (JSON lines with \"text\" "
                         "and \"label\" have)")
    else:
        texts = tuple(lines)
    if not texts:
        kept = f" labelled {label!r}" if label is not None else ""
        raise ValueError(f"{path} holds no texts{kept}")
    return texts


def _labelled(lines: Sequence[str], path: Path, label: str | None) -> list[str]:
    texts = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            text, its_label = record["text"], record.get("label")
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ValueError(f"{path}: line {number} is not a JSON object with a \"text\" field") from None
        if not isinstance(text, str):
            raise ValueError(f"{path}: line {number}: \"text\" is not a string")
        if label is None or its_label == label:
            texts.append(text)
    return texts


def shuffled(texts: Sequence[str], seed: int) -> tuple[str, ...]:
    """The texts in a seeded order, so a file sorted by length does not send all its short lines first."""
    order = list(texts)
    random.Random(seed).shuffle(order)
    return tuple(order)
