"""The course's story corpus and its byte-level BPE tokenizer: the data of notebooks 09 and 11, no model code.

    stories = corpus(1000, seed=1)                           # short children's stories, the same for a seed
    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)      # the shipped byte-level BPE (1024 tokens)
    train = windows(token_stream(tokenizer, stories), 128)   # (N, 128) ids: <|endoftext|> story <|endoftext|> ...

`corpus()` writes stories from templates (pets that get lost and found, toys, baking, weather, animals,
counting, sharing, trips), some ending well and some not, with names and pronouns kept consistent within a
story: no downloads. `train_tokenizer()` trains a byte-level BPE on them with `tokenizers` (GPT-2's
pre-tokenizer; its trainer is deterministic for a given corpus). `MODEL_DIR` holds the shipped tokenizer and the
course's pre-trained GPT (`courselib.gpt` builds and loads that model).

This module holds data only: notebook 09's cells and hidden checks import it, and it holds none of the
answers notebook 09 asks for (the course's reference models live in courselib.gpt, courselib.fused_gpt and
courselib.llama_model, which notebook 09's grading kernel never imports).
"""
import pathlib
import random

import torch

MODEL_DIR = pathlib.Path(__file__).resolve().parent / "data" / "tiny_gpt"
EOS = "<|endoftext|>"
SEED = 0
VOCAB_SIZE = 1024
CONTEXT = 128
NUM_STORIES = 100_000
HELD_OUT_SEED = 12345  # the stories perplexity is measured on: the same generator, another seed

# ---------------------------------------------------------------------------------------- corpus
NAMES = [("Lily", "she", "her"), ("Tom", "he", "his"), ("Mia", "she", "her"), ("Ben", "he", "his"),
         ("Anna", "she", "her"), ("Sam", "he", "his"), ("Lucy", "she", "her"), ("Max", "he", "his"),
         ("Emma", "she", "her"), ("Leo", "he", "his"), ("Sara", "she", "her"), ("Jack", "he", "his"),
         ("Zoe", "she", "her"), ("Finn", "he", "his"), ("Ella", "she", "her"), ("Noah", "he", "his")]
PETS = ["dog", "cat", "puppy", "kitten", "rabbit", "duck", "hamster", "parrot"]
PET_NAMES = ["Spot", "Bella", "Coco", "Pip", "Rex", "Daisy", "Milo", "Bobo", "Sunny", "Pepper"]
ADJECTIVES = ["little", "small", "big", "fluffy", "happy", "sleepy", "brown", "white", "funny", "old"]
PLACES = ["park", "beach", "forest", "garden", "farm", "lake", "hill", "market", "zoo", "playground"]
THINGS = [("ball", "red"), ("kite", "blue"), ("box", "brown"), ("hat", "yellow"), ("shell", "pink"),
          ("stick", "long"), ("flower", "purple"), ("feather", "white"), ("stone", "shiny"), ("key", "gold")]
HIDING = ["under a tree", "behind a big rock", "in the tall grass", "next to the pond", "under a bench",
          "inside an old boot", "near the gate", "under a pile of leaves"]
TOYS = ["teddy bear", "toy car", "doll", "red truck", "book", "blue ball", "toy boat", "kite"]
ROOM_SPOTS = ["under the bed", "behind the sofa", "in the toy box", "on the shelf", "under the table",
              "in the garden", "in the bath", "behind the door"]
BAKES = [("a cake", "the cake was"), ("some cookies", "the cookies were"), ("a pie", "the pie was"),
         ("some bread", "the bread was"), ("a pizza", "the pizza was"), ("some pancakes", "the pancakes were"),
         ("a big soup", "the soup was")]
INGREDIENTS = ["flour", "eggs", "milk", "sugar", "butter", "apples", "cheese", "honey", "carrots", "berries"]
FAMILY = ["mom", "dad", "grandma", "grandpa", "sister", "brother", "aunt", "uncle"]
WEATHER = [("cold", "snowy", "put on a warm coat and a hat", "built a snowman"),
           ("hot", "sunny", "put on a sun hat", "ate an ice cream"),
           ("wet", "rainy", "put on a raincoat and boots", "jumped in every puddle"),
           ("windy", "windy", "put on a jumper", "flew a kite")]
ANIMALS = [("cow", "grass", "moo", "on the farm"), ("lion", "meat", "roar", "in the zoo"),
           ("duck", "bread", "quack", "on the lake"), ("owl", "mice", "hoot", "in the forest"),
           ("frog", "flies", "croak", "by the pond"), ("horse", "hay", "neigh", "in the field"),
           ("bee", "nectar", "buzz", "in the garden"), ("monkey", "bananas", "chatter", "in the zoo")]
FEELINGS_GOOD = ["happy", "glad", "proud", "excited"]
FEELINGS_BAD = ["sad", "worried", "upset", "scared"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
TIMES = ["morning", "afternoon", "evening"]
NUMBERS = ["two", "three", "four", "five", "six", "seven", "eight"]
COUNTABLE = [("apples", "basket"), ("eggs", "nest"), ("fish", "pond"), ("birds", "tree"),
             ("cookies", "jar"), ("boats", "harbour"), ("ducks", "lake"), ("shells", "bucket")]
VEHICLES = ["bus", "train", "boat", "car", "bike"]
SIGHTS = ["tall tower", "big ship", "old castle", "white horse", "funny clown", "huge fish"]
OPENINGS = ["Once upon a time,", "One day,", "Long ago,", "One {time},", "On {day},"]


def _cap(text):
    return text[0].upper() + text[1:]


def _a(phrase):
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def _opening(r):
    return r.choice(OPENINGS).format(time=r.choice(TIMES), day=r.choice(DAYS))


def _story_pet(r):
    name, he, his = r.choice(NAMES)
    pet, pet_name, adjective, place = r.choice(PETS), r.choice(PET_NAMES), r.choice(ADJECTIVES), r.choice(PLACES)
    thing, colour = r.choice(THINGS)
    story = [f"{_opening(r)} {name} had {_a(adjective)} {pet} called {pet_name}.",
             f"{pet_name} liked to play with {_a(colour)} {thing}.",
             f"That {r.choice(TIMES)}, {name} and {pet_name} went to the {place}."]
    if r.random() < 0.5:
        story += [f"{pet_name} ran after the {thing}, and it rolled {r.choice(HIDING)}.",
                  f"{name} looked and looked, and at last {he} found it.",
                  f"{name} was {r.choice(FEELINGS_GOOD)}, and so was {pet_name}."]
    else:
        story += [f"{pet_name} ran away, and {name} could not find {pet_name} anywhere.",
                  f"{name} felt {r.choice(FEELINGS_BAD)}.",
                  f"Then {he} heard a sound {r.choice(HIDING)}. It was {pet_name}!",
                  f"{name} gave {pet_name} a big hug, and they went home together."]
    return story


def _story_lost_toy(r):
    (name, he, his), (friend, _, _) = r.sample(NAMES, 2)
    toy = r.choice(TOYS)
    first, second, third = r.sample(ROOM_SPOTS, 3)
    story = [f"{_opening(r)} {name} could not find {his} {toy}.",
             f"{_cap(he)} looked {first} and {second}, but it was not there.",
             f"{name} was {r.choice(FEELINGS_BAD)}.",
             f"{friend} came to help."]
    if r.random() < 0.7:
        story += [f"{friend} looked {third} and said, \"Here it is!\"",
                  f"{name} smiled and said, \"Thank you, {friend}!\"",
                  f"Then they played with the {toy} all day."]
    else:
        story += [f"They looked {third} too, but the {toy} was gone.",
                  f"That night {name} went to bed without {his} {toy}.",
                  f"In the morning, {his} {r.choice(FAMILY)} found it in the car."]
    return story


def _story_baking(r):
    name, _, his = r.choice(NAMES)
    relative, (bake, the_bake_was) = r.choice(FAMILY), r.choice(BAKES)
    a, b, c = r.sample(INGREDIENTS, 3)
    story = [f"{_opening(r)} {name} and {his} {relative} wanted to make {bake}.",
             f"They put {a}, {b} and {c} in a big bowl.",
             f"{name} mixed it with a spoon."]
    if r.random() < 0.7:
        story += ["Then they put it in the oven and waited.",
                  "Soon the kitchen smelled very good.",
                  f"{_cap(the_bake_was)} ready, and everyone had some.",
                  f"{name} felt {r.choice(FEELINGS_GOOD)}."]
    else:
        story += ["But they forgot it in the oven, and it burned.",
                  f"{name} was {r.choice(FEELINGS_BAD)}, but {his} {relative} laughed.",
                  f"\"We can make another one,\" said {his} {relative}. And so they did."]
    return story


def _story_weather(r):
    name, he, _ = r.choice(NAMES)
    feeling, kind, clothes, fun = r.choice(WEATHER)
    place = r.choice(PLACES)
    return [f"It was a {kind} day.",
            f"{name} wanted to go to the {place}.",
            f"It was {feeling} outside, so {he} {clothes}.",
            f"At the {place}, {name} {fun}.",
            f"When it got dark, {he} went home and had a warm bath.",
            "It was a good day."]


def _story_animal(r):
    animal, food, sound, home = r.choice(ANIMALS)
    name, he, _ = r.choice(NAMES)
    return [f"{_opening(r)} there was {_a(r.choice(ADJECTIVES))} {animal} {home}.",
            f"Every day the {animal} ate {food}.",
            f"When the {animal} was happy, it said \"{sound}\".",
            f"One day {name} came to see the {animal}.",
            f"{name} said hello, and the {animal} said \"{sound}, {sound}\".",
            f"{name} laughed. From then on, {he} came to see the {animal} every {r.choice(DAYS)}."]


def _story_counting(r):
    name, he, his = r.choice(NAMES)
    things, place = r.choice(COUNTABLE)
    i = r.randrange(len(NUMBERS) - 1)
    return [f"{_opening(r)} {name} counted the {things} in the {place}.",
            f"There were {NUMBERS[i]} {things}.",
            f"Then one more came, and now there were {NUMBERS[i + 1]}.",
            f"\"{_cap(NUMBERS[i + 1])} {things}!\" said {name}.",
            f"{_cap(he)} told {his} {r.choice(FAMILY)}, and they counted them again together."]


def _story_sharing(r):
    (a, _, _), (b, _, _) = r.sample(NAMES, 2)
    place, (thing, colour) = r.choice(PLACES), r.choice(THINGS)
    story = [f"{_opening(r)} {a} and {b} went to the {place}.",
             f"{a} found {_a(colour)} {thing}.",
             f"{b} wanted the {thing} too."]
    if r.random() < 0.6:
        story += ["They did not fight. They took turns.",
                  f"First {a} played with the {thing}, and then {b} did.",
                  f"Sharing made them both {r.choice(FEELINGS_GOOD)}."]
    else:
        story += [f"They pulled and pulled, and the {thing} broke.",
                  f"Now nobody could play with it, and they were both {r.choice(FEELINGS_BAD)}.",
                  "\"Next time we will share,\" they said."]
    return story


def _story_trip(r):
    name, he, his = r.choice(NAMES)
    vehicle, relative, sight = r.choice(VEHICLES), r.choice(FAMILY), r.choice(SIGHTS)
    return [f"{_opening(r)} {name} went to the city with {his} {relative}.",
            f"They went by {vehicle}.",
            f"In the city, {name} saw {_a(sight)}.",
            f"{_cap(he)} had never seen {_a(sight)} before.",
            f"On the way home, {name} told {his} {relative} about the {sight}, and fell asleep."]


STORY_MAKERS = [_story_pet, _story_lost_toy, _story_baking, _story_weather, _story_animal, _story_counting,
                _story_sharing, _story_trip]


def corpus(num_stories=NUM_STORIES, seed=SEED):
    """`num_stories` short stories (strings), the same ones for the same seed."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(STORY_MAKERS)(rng)) for _ in range(num_stories)]


# ------------------------------------------------------------------------------------- tokenizer
def train_tokenizer(stories, vocab_size=VOCAB_SIZE):
    """A byte-level BPE (GPT-2's pre-tokenizer and decoder) trained on `stories`, as a transformers
    tokenizer whose only special token is <|endoftext|> (id 0), GPT-2's bos, eos and unk."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(stories, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=EOS, eos_token=EOS, unk_token=EOS,
                                   model_max_length=CONTEXT, clean_up_tokenization_spaces=False)


def token_stream(tokenizer, stories):
    """One long list of ids: <|endoftext|> story <|endoftext|> story ..., as GPT-2 was trained."""
    eos = tokenizer.convert_tokens_to_ids(EOS)
    stream = []
    for ids in tokenizer(stories)["input_ids"]:
        stream.append(eos)
        stream.extend(ids)
    return torch.tensor(stream)


def windows(stream, context=CONTEXT):
    """The stream cut into consecutive (N, context) windows (the tail that doesn't fill one is dropped)."""
    n = len(stream) // context
    return stream[:n * context].view(n, context)


def held_out_windows(tokenizer, num_stories=2000, seed=HELD_OUT_SEED):
    """(N, CONTEXT) windows of stories the shipped model never saw (another seed of the same generator)."""
    return windows(token_stream(tokenizer, corpus(num_stories, seed)))
