"""The Twenty Questions word list: common concrete nouns (written for rolecast), and its split."""
from __future__ import annotations

import random

WORDS: tuple[str, ...] = (
    # animals
    "dog", "cat", "horse", "cow", "pig", "sheep", "chicken", "duck", "rabbit", "mouse",
    "elephant", "lion", "tiger", "bear", "monkey", "giraffe", "zebra", "snake", "frog", "fish",
    "shark", "whale", "dolphin", "bee", "butterfly", "spider", "owl", "eagle", "penguin", "turtle",
    # food and drink
    "apple", "banana", "orange", "grape", "lemon", "strawberry", "carrot", "potato", "tomato", "onion",
    "bread", "cheese", "egg", "pizza", "cake", "cookie", "rice", "soup", "sandwich", "chocolate",
    "milk", "coffee", "tea", "honey", "butter",
    # household
    "chair", "table", "bed", "sofa", "lamp", "clock", "mirror", "pillow", "blanket", "door",
    "window", "carpet", "curtain", "shelf", "drawer", "cup", "plate", "bowl", "spoon", "fork",
    "knife", "pan", "kettle", "fridge", "oven", "toaster", "candle", "key", "broom", "bucket",
    "towel", "soap", "toothbrush", "comb", "vase",
    # clothes and personal items
    "shirt", "hat", "shoe", "sock", "glove", "scarf", "coat", "dress", "belt", "umbrella",
    "wallet", "ring", "watch", "glasses", "backpack",
    # tools, toys, objects
    "hammer", "saw", "screwdriver", "ladder", "rope", "nail", "shovel", "scissors", "pencil", "pen",
    "book", "notebook", "envelope", "stamp", "ball", "kite", "doll", "puzzle", "balloon", "drum",
    "guitar", "piano", "violin", "trumpet", "camera", "phone", "computer", "television", "radio", "battery",
    # vehicles
    "car", "bus", "train", "bicycle", "motorcycle", "truck", "airplane", "helicopter", "boat", "ship",
    "tractor", "rocket",
    # nature and places
    "tree", "flower", "grass", "leaf", "rock", "mountain", "river", "lake", "beach", "island",
    "cloud", "rainbow", "moon", "sun", "star", "volcano", "cave", "desert", "forest", "snowman",
    # buildings
    "house", "castle", "bridge", "tower", "barn", "tent", "church", "school", "hospital", "lighthouse",
)


def split_words(seed: int = 0, test_fraction: float = 0.2) -> tuple[list[str], list[str]]:
    """(train, test): a seeded shuffle of the list, the last ``test_fraction`` held out."""
    words = sorted(WORDS)
    random.Random(seed).shuffle(words)
    n_test = round(len(words) * test_fraction)
    return sorted(words[: len(words) - n_test]), sorted(words[len(words) - n_test:])
