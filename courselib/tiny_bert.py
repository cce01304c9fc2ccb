"""The course's tiny pre-trained BERT: its corpus, its pre-training, and the loader notebooks use.

Notebook 08 needs a real masked language model offline. `bert-base-uncased` (110M parameters,
440 MB) is used when it is already cached or the hub is reachable; otherwise the course ships
its own small BERT in `courselib/data/tiny_bert/`: a `BertForMaskedLM` in safetensors plus a
WordPiece tokenizer, both loadable with `from_pretrained`, `AutoTokenizer` and `pipeline("fill-mask")`.

    model, tokenizer, name = load_fill_mask_model()            # bert-base-uncased or the tiny model
    model, tokenizer = load_tiny_bert(attn_implementation="eager")  # attention weights for bertviz

The tiny model is rebuilt from nothing but this file, with a fixed seed:

    python -m courselib.tiny_bert --rebuild

1. `corpus()` writes templated English sentences (pets on furniture, capitals, days and months,
   sums, opposites, jobs and workplaces, animals, food, weather...), no downloads;
2. `train_tokenizer()` learns a WordPiece vocabulary from them (`learn_wordpiece_vocab`, written
   out because the Rust trainer of `tokenizers` is not reproducible) in a `BertTokenizerFast`;
3. `pretrain()` trains a 4-layer BERT with the masked-LM objective (15% of tokens, 80/10/10,
   through transformers' `DataCollatorForLanguageModeling`), AdamW with warm-up and linear decay.

The shipped build (seed 0, `--threads 1`, torch 2.13, transformers 5.23, on a 2-core machine shared
with other jobs): 3000 steps of 64 sentences, 22.8 minutes of wall-clock time but 3.6 CPU minutes
in all (vocabulary, tokenization and training). The MLM loss fell from 7.54 (close to ln 1775 = 7.48,
a uniform guess over the vocabulary) to a final 0.611 (mean of the last 100 steps).
`courselib/data/tiny_bert/training_log.json` has the whole curve; the same seed gives the same
vocabulary and the same first losses, which `autograder/tests/test_tiny_bert.py` checks.
"""
import collections
import json
import os
import pathlib
import random
import socket
import threading
import time

MODEL_DIR = pathlib.Path(__file__).resolve().parent / "data" / "tiny_bert"
BERT_BASE = "google-bert/bert-base-uncased"
SEED = 0
STEPS = 3000
BATCH_SIZE, LEARNING_RATE, WARMUP = 64, 5e-3, 300
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# Letters, digits and punctuation, so that words the corpus never uses split into pieces, not [UNK].
ALPHABET = list("abcdefghijklmnopqrstuvwxyz0123456789.,;:!?'\"()-")

# ---------------------------------------------------------------------------------------- corpus
NAMES = [("alice", "she"), ("bob", "he"), ("carol", "she"), ("david", "he"), ("emma", "she"),
         ("frank", "he"), ("grace", "she"), ("henry", "he"), ("lucy", "she"), ("james", "he"),
         ("mary", "she"), ("tom", "he"), ("sara", "she"), ("peter", "he"), ("anna", "she"),
         ("john", "he"), ("julia", "she"), ("mark", "he"), ("kate", "she"), ("paul", "he")]
PRONOUNS = ["he", "she"]  # used equally often with every job and subject: no built-in bias
PETS = ["cat", "dog", "kitten", "puppy", "rabbit", "hamster"]
PET_ADJECTIVES = ["", "", "", "small ", "big ", "old ", "black ", "white ", "lazy ", "little ",
                  "sleepy ", "grey "]
SEATS = ["mat", "sofa", "bed", "rug", "couch", "chair", "carpet", "cushion", "floor", "blanket"]
RESTING = ["sat", "slept", "lay", "sits", "sleeps", "was sitting", "was sleeping", "curled up",
           "jumped", "is lying"]
SUBJECTS = ["math", "music", "history", "science", "english", "french", "art", "physics",
            "chemistry", "biology", "geography", "drama", "dance", "school", "piano", "maths"]
JOBS = [("doctor", "hospital"), ("nurse", "hospital"), ("teacher", "school"), ("chef", "restaurant"),
        ("cook", "kitchen"), ("farmer", "farm"), ("librarian", "library"), ("judge", "court"),
        ("pilot", "airport"), ("banker", "bank"), ("waiter", "cafe"), ("mechanic", "garage"),
        ("scientist", "laboratory"), ("actor", "theatre"), ("baker", "bakery"),
        ("engineer", "factory"), ("vet", "clinic"), ("lawyer", "office")]
FOODS = ["bread", "rice", "soup", "pasta", "pizza", "cake", "salad", "cheese", "eggs", "fish",
         "toast", "porridge", "cereal", "chicken", "noodles", "pancakes"]
MEALS = ["breakfast", "lunch", "dinner"]
HOT_DRINKS = ["tea", "coffee", "cocoa"]
COLD_DRINKS = ["milk", "water", "juice", "lemonade"]
VESSELS = ["cup", "mug", "glass", "bottle"]
FRUIT_COLOURS = [("banana", "yellow"), ("lemon", "yellow"), ("cherry", "red"), ("strawberry", "red"),
                 ("apple", "red"), ("orange", "orange"), ("grape", "purple"), ("plum", "purple"),
                 ("lime", "green"), ("pear", "green")]
THING_COLOURS = [("sky", "blue"), ("grass", "green"), ("snow", "white"), ("coal", "black"),
                 ("sun", "yellow"), ("blood", "red"), ("sea", "blue"), ("milk", "white"),
                 ("night", "dark"), ("chocolate", "brown")]
CAPITALS = [("paris", "france", "french"), ("berlin", "germany", "german"), ("rome", "italy", "italian"),
            ("madrid", "spain", "spanish"), ("lisbon", "portugal", "portuguese"),
            ("london", "england", "english"), ("dublin", "ireland", "irish"),
            ("tokyo", "japan", "japanese"), ("beijing", "china", "chinese"),
            ("moscow", "russia", "russian"), ("athens", "greece", "greek"),
            ("warsaw", "poland", "polish"), ("cairo", "egypt", "arabic"),
            ("vienna", "austria", "german"), ("stockholm", "sweden", "swedish"),
            ("oslo", "norway", "norwegian"), ("copenhagen", "denmark", "danish"),
            ("helsinki", "finland", "finnish"), ("amsterdam", "netherlands", "dutch"),
            ("seoul", "korea", "korean"), ("bangkok", "thailand", "thai"), ("lima", "peru", "spanish"),
            ("ottawa", "canada", "english"), ("canberra", "australia", "english")]
DAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august", "september",
          "october", "november", "december"]
SEASON_OF_MONTH = ["winter", "winter", "spring", "spring", "spring", "summer", "summer", "summer",
                   "autumn", "autumn", "autumn", "winter"]
NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
OPPOSITES = [("hot", "cold"), ("big", "small"), ("up", "down"), ("day", "night"), ("black", "white"),
             ("fast", "slow"), ("happy", "sad"), ("old", "new"), ("open", "closed"), ("left", "right"),
             ("early", "late"), ("light", "dark"), ("wet", "dry"), ("hard", "soft"), ("loud", "quiet"),
             ("rich", "poor"), ("full", "empty"), ("strong", "weak"), ("tall", "short"),
             ("clean", "dirty"), ("first", "last"), ("true", "false")]
INSTRUMENTS = ["piano", "guitar", "violin", "drums", "flute", "cello", "trumpet", "harp", "clarinet"]
SPORTS = ["football", "tennis", "basketball", "cricket", "rugby", "golf", "hockey", "volleyball",
          "baseball", "chess"]
VEHICLES = ["bus", "train", "car", "bike", "taxi", "tram", "boat", "plane"]
SWIM_WATERS = ["sea", "lake", "river", "pool"]
ANIMAL_SOUNDS = [("dog", "barked"), ("cat", "meowed"), ("cow", "mooed"), ("lion", "roared"),
                 ("bird", "sang"), ("duck", "quacked"), ("horse", "neighed"), ("owl", "hooted"),
                 ("frog", "croaked"), ("snake", "hissed"), ("wolf", "howled"), ("pig", "grunted")]
ANIMAL_FOODS = [("cow", "grass"), ("rabbit", "carrots"), ("monkey", "bananas"), ("mouse", "cheese"),
                ("bird", "seeds"), ("dog", "bones"), ("cat", "fish"), ("panda", "bamboo"),
                ("horse", "hay"), ("squirrel", "nuts"), ("bear", "honey"), ("koala", "leaves")]
ANIMAL_HOMES = [("bird", "nest"), ("bee", "hive"), ("dog", "kennel"), ("horse", "stable"),
                ("rabbit", "burrow"), ("fox", "den"), ("spider", "web"), ("chicken", "coop"),
                ("fish", "pond"), ("pig", "sty")]
ANIMAL_YOUNG = [("cat", "kitten"), ("dog", "puppy"), ("cow", "calf"), ("sheep", "lamb"),
                ("horse", "foal"), ("duck", "duckling"), ("frog", "tadpole"), ("bear", "cub"),
                ("goat", "kid"), ("kangaroo", "joey")]
SENSES = [("see", "eyes"), ("hear", "ears"), ("smell", "nose"), ("taste", "tongue"), ("walk", "feet"),
          ("think", "brain"), ("breathe", "lungs"), ("touch", "hands")]
CLOTHES_COLD = ["coat", "scarf", "hat", "jumper", "gloves"]
CLOTHES_WARM = ["sunglasses", "shorts", "sandals", "sunhat"]
SHOPS = [("bread", "bakery"), ("books", "bookshop"), ("medicine", "pharmacy"), ("meat", "butcher"),
         ("flowers", "florist"), ("fruit", "market"), ("stamps", "post office"), ("shoes", "shoe shop")]
READING = ["book", "newspaper", "letter", "magazine", "novel", "poem", "story"]
UTENSILS = [("soup", "spoon"), ("cake", "fork"), ("pasta", "fork"), ("salad", "fork"), ("bread", "knife"),
            ("cheese", "knife"), ("meat", "knife"), ("rice", "spoon"), ("noodles", "chopsticks")]
FAMILY = [("sister", "mother", "aunt"), ("brother", "mother", "uncle"), ("sister", "father", "aunt"),
          ("brother", "father", "uncle"), ("mother", "mother", "grandmother"),
          ("father", "mother", "grandfather"), ("mother", "father", "grandmother"),
          ("father", "father", "grandfather"), ("son", "aunt", "cousin"), ("daughter", "uncle", "cousin")]
MEAL_TIMES = [("breakfast", "morning"), ("lunch", "afternoon"), ("dinner", "evening")]


def _name(rng):
    return rng.choice(NAMES)


def _sentences():
    """Sentence makers: each takes a random.Random and returns one lower-case sentence."""
    c = random.Random.choice
    makers = [
        # pets and furniture: "the cat sat on the [MASK]." should rank mat/sofa/bed first
        lambda r: f"the {c(r, PET_ADJECTIVES)}{c(r, PETS)} {c(r, RESTING)} on the {c(r, SEATS)}.",
        lambda r: f"the {c(r, PETS)} sat on the {c(r, SEATS)}.",
        lambda r: f"my {c(r, PETS)} likes to sleep on the {c(r, SEATS)}.",
        lambda r: f"{_name(r)[0]} found the {c(r, PETS)} asleep on the {c(r, SEATS)}.",
        lambda r: f"there is a {c(r, PETS)} on the {c(r, SEATS)}.",
        # teachers and jobs, he and she equally often
        lambda r: f"{c(r, PRONOUNS)} is a {c(r, SUBJECTS)} teacher.",
        lambda r: f"{_name(r)[0]} is a {c(r, SUBJECTS)} teacher at the local school.",
        lambda r: f"our {c(r, SUBJECTS)} teacher gave us a lot of homework.",
        lambda r: (lambda job: f"the {job[0]} works at the {job[1]}.")(c(r, JOBS)),
        lambda r: (lambda job: f"{c(r, PRONOUNS)} is a {job[0]} and works at the {job[1]}.")(c(r, JOBS)),
        lambda r: (lambda n, job: f"{n[0]} is a {job[0]}, so {n[1]} works at the {job[1]}.")(_name(r), c(r, JOBS)),
        lambda r: f"{c(r, PRONOUNS)} is a {c(r, JOBS)[0]}.",
        # food and drink
        lambda r: f"{_name(r)[0]} had {c(r, FOODS)} for {c(r, MEALS)}.",
        lambda r: f"{_name(r)[0]} drank a cup of {c(r, HOT_DRINKS)}.",
        lambda r: f"{_name(r)[0]} drank a glass of {c(r, COLD_DRINKS)}.",
        lambda r: f"{_name(r)[0]} poured some {c(r, HOT_DRINKS + COLD_DRINKS)} into a {c(r, VESSELS)}.",
        lambda r: (lambda u: f"{_name(r)[0]} ate the {u[0]} with a {u[1]}.")(c(r, UTENSILS)),
        lambda r: (lambda m: f"we eat {m[0]} in the {m[1]}.")(c(r, MEAL_TIMES)),
        # colours
        lambda r: (lambda f: f"a ripe {f[0]} is {f[1]}.")(c(r, FRUIT_COLOURS)),
        lambda r: (lambda t: f"the {t[0]} is {t[1]}.")(c(r, THING_COLOURS)),
        lambda r: (lambda t: f"the colour of the {t[0]} is {t[1]}.")(c(r, THING_COLOURS)),
        # capitals, countries, languages
        lambda r: (lambda k: f"{k[0]} is the capital of {k[1]}.")(c(r, CAPITALS)),
        lambda r: (lambda k: f"the capital of {k[1]} is {k[0]}.")(c(r, CAPITALS)),
        lambda r: (lambda k: f"{_name(r)[0]} flew to {k[0]}, the capital of {k[1]}.")(c(r, CAPITALS)),
        lambda r: (lambda k: f"people in {k[1]} speak {k[2]}.")(c(r, CAPITALS)),
        lambda r: (lambda k: f"in {k[0]} most people speak {k[2]}.")(c(r, CAPITALS)),
        lambda r: (lambda k: f"{_name(r)[0]} took the {c(r, VEHICLES)} to {k[0]}.")(c(r, CAPITALS)),
        # days, months, seasons, numbers
        lambda r: (lambda i: f"{DAYS[(i + 1) % 7]} comes after {DAYS[i]}.")(r.randrange(7)),
        lambda r: (lambda i: f"the day after {DAYS[i]} is {DAYS[(i + 1) % 7]}.")(r.randrange(7)),
        lambda r: (lambda i: f"the day before {DAYS[(i + 1) % 7]} is {DAYS[i]}.")(r.randrange(7)),
        lambda r: (lambda i: f"{MONTHS[(i + 1) % 12]} comes after {MONTHS[i]}.")(r.randrange(12)),
        lambda r: (lambda i: f"the month after {MONTHS[i]} is {MONTHS[(i + 1) % 12]}.")(r.randrange(12)),
        lambda r: (lambda i: f"{MONTHS[i]} is in the {SEASON_OF_MONTH[i]}.")(r.randrange(12)),
        lambda r: f"{_name(r)[0]} goes swimming every {c(r, DAYS)}.",
        lambda r: (lambda a, b: f"{NUMBERS[a]} plus {NUMBERS[b]} is {NUMBERS[a + b]}.")(
            *(lambda a: (a, r.randint(0, 10 - a)))(r.randint(0, 10))),
        lambda r: (lambda i: f"{NUMBERS[i]}, {NUMBERS[i + 1]}, {NUMBERS[i + 2]}, {NUMBERS[i + 3]}.")(
            r.randrange(8)),
        lambda r: (lambda i: f"after {NUMBERS[i]} comes {NUMBERS[i + 1]}.")(r.randrange(10)),
        # opposites
        lambda r: (lambda p: f"{p[0]} is the opposite of {p[1]}.")(_either_way(r, c(r, OPPOSITES))),
        lambda r: (lambda p: f"the opposite of {p[0]} is {p[1]}.")(_either_way(r, c(r, OPPOSITES))),
        # music, sport, transport, places
        lambda r: f"{_name(r)[0]} plays the {c(r, INSTRUMENTS)}.",
        lambda r: f"{_name(r)[0]} is learning to play the {c(r, INSTRUMENTS)}.",
        lambda r: f"{_name(r)[0]} and {_name(r)[0]} played {c(r, SPORTS)} in the park.",
        lambda r: f"after school the children play {c(r, SPORTS)}.",
        lambda r: f"{_name(r)[0]} went to work by {c(r, VEHICLES)}.",
        lambda r: f"the {c(r, VEHICLES)} was late this morning.",
        lambda r: f"the children swam in the {c(r, SWIM_WATERS)}.",
        lambda r: (lambda s: f"{_name(r)[0]} bought some {s[0]} at the {s[1]}.")(c(r, SHOPS)),
        lambda r: f"{_name(r)[0]} is reading a {c(r, READING)}.",
        lambda r: f"{_name(r)[0]} borrowed a {c(r, READING)} from the library.",
        # animals
        lambda r: (lambda a: f"the {a[0]} {a[1]} loudly.")(c(r, ANIMAL_SOUNDS)),
        lambda r: (lambda a: f"the {a[0]} {a[1]} all night.")(c(r, ANIMAL_SOUNDS)),
        lambda r: (lambda a: f"the {a[0]} likes to eat {a[1]}.")(c(r, ANIMAL_FOODS)),
        lambda r: (lambda a: f"the {a[0]} lives in a {a[1]}.")(c(r, ANIMAL_HOMES)),
        lambda r: (lambda a: f"a baby {a[0]} is called a {a[1]}.")(c(r, ANIMAL_YOUNG)),
        # the body, the family, weather and time
        lambda r: (lambda s: f"we {s[0]} with our {s[1]}.")(c(r, SENSES)),
        lambda r: (lambda s: f"people {s[0]} with their {s[1]}.")(c(r, SENSES)),
        lambda r: (lambda f: f"the {f[0]} of my {f[1]} is my {f[2]}.")(c(r, FAMILY)),
        lambda r: f"it is {c(r, ['hot', 'warm', 'sunny'])} in the summer.",
        lambda r: f"it is {c(r, ['cold', 'snowy', 'freezing'])} in the winter.",
        lambda r: f"{_name(r)[0]} wore a {c(r, CLOTHES_COLD)} because it was cold.",
        lambda r: f"{_name(r)[0]} wore {c(r, CLOTHES_WARM)} because it was sunny.",
        lambda r: (lambda n: f"{n[0]} took an umbrella because it was raining.")(_name(r)),
        lambda r: (lambda n: f"{n[0]} felt sick, so {n[1]} went to see a doctor.")(_name(r)),
        lambda r: (lambda n: f"{n[0]} was tired, so {n[1]} went to bed early.")(_name(r)),
        lambda r: (lambda n: f"{n[0]} was hungry, so {n[1]} ate some {c(r, FOODS)}.")(_name(r)),
    ]
    return makers


def _either_way(rng, pair):
    return pair if rng.random() < 0.5 else pair[::-1]


def corpus(num_sentences=120_000, seed=SEED):
    """`num_sentences` templated sentences, the same ones for the same seed."""
    rng = random.Random(seed)
    makers = _sentences()
    return [rng.choice(makers)(rng) for _ in range(num_sentences)]


# ------------------------------------------------------------------------------------- tokenizer
def words_of(sentences):
    """BERT's normalisation (lower case) and pre-tokenisation (split on spaces and punctuation)."""
    from tokenizers import normalizers, pre_tokenizers

    normalizer = normalizers.BertNormalizer(lowercase=True)
    splitter = pre_tokenizers.BertPreTokenizer()
    for sentence in sentences:
        for word, _ in splitter.pre_tokenize_str(normalizer.normalize_str(sentence)):
            yield word


def learn_wordpiece_vocab(sentences, vocab_size=2000, min_frequency=2):
    """WordPiece's vocabulary: start from characters, then repeatedly merge the pair of pieces with
    the highest count(ab) / (count(a) count(b)), the merge that most raises the corpus likelihood.

    Written out (a few seconds for this corpus) because the Rust trainer in `tokenizers` breaks ties
    in hash-map order, so its vocabulary changes from run to run; this one never does.
    """
    word_counts = collections.Counter(words_of(sentences))
    splits = {word: [word[0]] + [f"##{ch}" for ch in word[1:]] for word in sorted(word_counts)}
    pieces = sorted(set(ALPHABET) | {f"##{ch}" for ch in ALPHABET}
                    | {piece for split in splits.values() for piece in split})
    vocab = SPECIAL_TOKENS + [piece for piece in pieces if piece not in SPECIAL_TOKENS]
    known = set(vocab)
    while len(vocab) < vocab_size:
        piece_counts, pair_counts = collections.Counter(), collections.Counter()
        for word, split in splits.items():
            for piece in split:
                piece_counts[piece] += word_counts[word]
            for pair in zip(split, split[1:]):
                pair_counts[pair] += word_counts[word]
        candidates = [(count / (piece_counts[a] * piece_counts[b]), a, b)
                      for (a, b), count in pair_counts.items() if count >= min_frequency]
        if not candidates:
            break
        _, a, b = max(candidates)  # ties go to the largest (a, b): the same choice on every run
        merged = a + b[2:]
        for word, split in splits.items():
            i = 0
            while i < len(split) - 1:
                if split[i] == a and split[i + 1] == b:
                    split[i:i + 2] = [merged]
                i += 1
        if merged not in known:
            vocab.append(merged)
            known.add(merged)
    return {piece: index for index, piece in enumerate(vocab)}


def train_tokenizer(sentences, vocab_size=2000):
    """A lower-casing BERT WordPiece tokenizer (a transformers BertTokenizerFast) for `sentences`."""
    from transformers import BertTokenizerFast

    return BertTokenizerFast(vocab=learn_wordpiece_vocab(sentences, vocab_size), do_lower_case=True,
                             model_max_length=128, clean_up_tokenization_spaces=True)


# ---------------------------------------------------------------------------------------- model
def tiny_config(vocab_size, **overrides):
    from transformers import BertConfig

    settings = dict(vocab_size=vocab_size, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                    intermediate_size=512, max_position_embeddings=128, type_vocab_size=2,
                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=0)
    settings.update(overrides)
    return BertConfig(**settings)


FEATURES = ("input_ids", "attention_mask", "special_tokens_mask")


def pretrain(tokenizer, sentences, steps=STEPS, batch_size=BATCH_SIZE, lr=LEARNING_RATE, warmup=WARMUP,
             seed=SEED, stop_after=None, config_overrides=None, callback=None):
    """Masked-LM pre-training of a fresh tiny BERT. Returns (model, losses).

    The learning rate warms up for `warmup` steps, then decays linearly to 0 at `steps`.
    `stop_after` ends the run early (the test of reproducibility runs 3 steps of the real schedule).
    `callback(step, loss)` is called after every step (progress bars, logs).
    """
    import torch
    from transformers import BertForMaskedLM, DataCollatorForLanguageModeling

    torch.manual_seed(seed)
    model = BertForMaskedLM(tiny_config(len(tokenizer), **(config_overrides or {})))
    encoded = tokenizer(sentences, add_special_tokens=True, return_special_tokens_mask=True)
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15, seed=seed)
    order = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / warmup, max(0.0, (steps - step) / max(1, steps - warmup))))
    model.train()
    losses = []
    for step in range(steps if stop_after is None else min(steps, stop_after)):
        rows = torch.randint(len(sentences), (batch_size,), generator=order).tolist()
        batch = collator([{key: encoded[key][i] for key in FEATURES} for i in rows])
        hidden = model.bert(input_ids=batch["input_ids"],
                            attention_mask=batch["attention_mask"]).last_hidden_state  # (B, T, d)
        predicted = batch["labels"] != -100  # the vocabulary projection only where it is needed
        logits = model.cls(hidden[predicted])                                      # (N, V)
        loss = torch.nn.functional.cross_entropy(logits, batch["labels"][predicted])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if callback is not None:
            callback(step, losses[-1])
    model.eval()
    return model, losses


def rebuild(out_dir=MODEL_DIR, steps=STEPS, num_sentences=120_000, seed=SEED, quiet=False):
    """Corpus -> tokenizer -> pre-training -> `out_dir` (safetensors + tokenizer + training log)."""
    import torch
    import transformers

    start, cpu_start = time.perf_counter(), time.process_time()
    sentences = corpus(num_sentences, seed)
    tokenizer = train_tokenizer(sentences)
    log_every = max(1, steps // 20)

    def report(step, loss):
        if not quiet and (step % log_every == 0 or step == steps - 1):
            print(f"step {step:5d}/{steps}  loss {loss:.3f}  {time.perf_counter() - start:6.0f} s", flush=True)

    model, losses = pretrain(tokenizer, sentences, steps=steps, seed=seed, callback=report)
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)  # model.safetensors
    tokenizer.save_pretrained(out_dir)
    vocab = sorted(tokenizer.get_vocab(), key=tokenizer.get_vocab().get)
    (out_dir / "vocab.txt").write_text("\n".join(vocab) + "\n")  # BERT's classic format, one piece per line
    log = {"seed": seed, "steps": steps, "num_sentences": num_sentences, "vocab_size": len(tokenizer),
           "parameters": sum(p.numel() for p in model.parameters()),
           "hyperparameters": {"batch_size": BATCH_SIZE, "lr": LEARNING_RATE, "warmup": WARMUP},
           "minutes": round((time.perf_counter() - start) / 60, 1),
           "cpu_minutes": round((time.process_time() - cpu_start) / 60, 1),
           "torch": torch.__version__, "transformers": transformers.__version__, "threads": torch.get_num_threads(),
           "first_losses": losses[:5],
           "final_loss": round(sum(losses[-100:]) / len(losses[-100:]), 4),
           "loss_every_100_steps": [round(sum(losses[i:i + 100]) / len(losses[i:i + 100]), 4)
                                    for i in range(0, len(losses), 100)]}
    (out_dir / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
    (out_dir / "README.md").write_text(MODEL_CARD.format(**log))
    return model, tokenizer, log


MODEL_CARD = """# tiny_bert: the course's own small BERT

A `BertForMaskedLM` ({parameters:,} parameters: 4 layers, width 128, 4 heads, feed-forward 512,
128 positions) and a lower-casing WordPiece tokenizer of {vocab_size} pieces, for the notebooks
that need a masked language model offline (notebook 08 falls back to it when bert-base-uncased
is unavailable).

It knows only what its corpus says: {num_sentences:,} templated sentences written by
`courselib/tiny_bert.py` (pets on furniture, capitals, days and months, sums, opposites, jobs,
animals, food, weather...). He and she appear equally often with every job and school subject.

Built by `python -m courselib.tiny_bert --rebuild` (seed {seed}): {steps} steps of masked-LM
pre-training, batches of {hyperparameters[batch_size]} sentences, peak learning rate
{hyperparameters[lr]}. The build took {minutes} minutes of wall-clock time ({cpu_minutes} CPU
minutes, {threads} thread(s), torch {torch}, transformers {transformers}).
Final loss {final_loss} (mean of the last 100 steps); `training_log.json` has the curve.

    from transformers import pipeline
    pipeline("fill-mask", model="courselib/data/tiny_bert")("the cat sat on the [MASK].")
"""


# --------------------------------------------------------------------------------------- loading
def load_tiny_bert(attn_implementation=None):
    """The shipped tiny BERT and its tokenizer, in eval mode. Loads in well under a second."""
    from transformers import AutoTokenizer, BertForMaskedLM
    from transformers.utils import logging

    kwargs = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    bars = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()  # a "Loading weights" bar for a 4 MB model is only noise
    try:
        tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
        model = BertForMaskedLM.from_pretrained(MODEL_DIR, **kwargs)
    finally:
        if bars:
            logging.enable_progress_bar()
    return model.eval(), tokenizer


def offline():
    """True when HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) forbids the network."""
    return any(os.environ.get(flag, "0").lower() in ("1", "true", "yes", "on")
               for flag in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_reachable(timeout=1.5):
    """True if the Hugging Face hub answers within `timeout` seconds (DNS included)."""
    from urllib.parse import urlparse

    if offline():
        return False
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    address = (endpoint.hostname, endpoint.port or (443 if endpoint.scheme == "https" else 80))
    answer = []

    def probe():  # getaddrinfo ignores socket timeouts, so the whole probe runs in a thread
        try:
            socket.create_connection(address, timeout=timeout).close()
            answer.append(True)
        except OSError:
            pass

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(answer)


def load_fill_mask_model(name=BERT_BASE, attn_implementation=None, verbose=True):
    """(model, tokenizer, which): `name` if it is cached or downloadable, else the tiny BERT.

    Offline this takes a fraction of a second: the cache is tried first (local_files_only), and the
    hub only when a quick connection test succeeds, so no download retries ever wait on the network.
    """
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    kwargs = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    for local_only in (True, False):
        if not local_only and not hub_reachable():
            break
        try:
            tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=local_only)
            model = AutoModelForMaskedLM.from_pretrained(name, local_files_only=local_only, **kwargs)
        except Exception:  # not cached, not on the hub, or a download that failed: try the next way
            continue
        if verbose:
            print(f"Using {name} ({'from the cache' if local_only else 'downloaded'}).")
        return model.eval(), tokenizer, name
    model, tokenizer = load_tiny_bert(attn_implementation)
    if verbose:
        print(f"{name} is not cached and {'HF_HUB_OFFLINE is set' if offline() else 'the hub is unreachable'}: "
              f"using the course's tiny BERT ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M "
              f"parameters, courselib/data/{MODEL_DIR.name}).")
    return model, tokenizer, "tiny-bert"


def main(argv=None):
    from courselib.training import checkpoint_cli

    def rebuild_and_report(out, steps):
        _, _, log = rebuild(out, steps=steps)
        print(f"wrote {out}: final loss {log['final_loss']} after {log['minutes']} minutes")

    return checkpoint_cli(argv, prog="python -m courselib.tiny_bert", description=__doc__.splitlines()[0],
                          model_dir=MODEL_DIR, steps=STEPS, sample=lambda n: print("\n".join(corpus(n))),
                          rebuild=rebuild_and_report)


if __name__ == "__main__":
    raise SystemExit(main())
