"""Hidden checks for 01_tokenization. Each check is one grade cell's hidden part.

Each has a probe (in the student's kernel: build the seeded corpora, words and vocabularies, call
the student's code, return what it produced) and a judge (in the grader: rebuild the same inputs, run
the oracle, compare, name the misconception whose output it matches). Layered as the course's tests
are: the format first, then values on seeded corpora and vocabularies, then behaviour. The oracles
are Hugging Face's own implementations, run by the judges only:
- `tokenizers.trainers.BpeTrainer` for `train_bpe`, on corpora whose first merges have no ties
  (its tie-break follows token ids, not strings, and varies between runs). Tie-breaking is checked
  against the rule as stated, with the pairs counted on words split by `tokenizers`' BPE model;
- `tokenizers.models.BPE(end_of_word_suffix="</w>")` for `bpe_encode`;
- `tokenizers.models.WordPiece` for `wordpiece_tokenize`;
- transformers' copy of GPT-2's `bytes_to_unicode` for `bytes_to_unicode`; tokenizers'
  `pre_tokenizers.ByteLevel(add_prefix_space=False)` for `byte_level_pretokenize`; `decoders.ByteLevel`
  and the course's byte-level BPE (`courselib/data/tiny_gpt/tokenizer.json`, trained on the course's
  stories) for `byte_level_decode`;
- `transformers.BertTokenizerFast(vocab=<vocab.txt>)` for `bert_encode_batch` (imported when first
  needed: it costs about 2 s).
- `tokenizers.models.Unigram` (its Viterbi search, `Model.tokenize`) for the optional `unigram_segment`,
  on seeded vocabularies and on words whose best split has no tie.
The seeds come from the grader's per-run token, so the hidden inputs change from run to run and are
never the visible tests' inputs.
"""
import copy
import functools
import pathlib
import string
import types
from collections import Counter

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from tokenizers.models import BPE, WordPiece

import courselib
from autograder.checks.common import Forbidden, Seeds, call, describe, probe


END = "</w>"


PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"


# ---------------------------------------------------------------- what the watch refuses
# tokenizers defines `tokenize` once, on Model, but called on a BPE it reaches the watch (a profile
# hook, common._c_names) as `BPE.tokenize`, a name that `tokenizers.models.Model.tokenize` doesn't
# cover: a method captured before the test (`_tokenize = BPE.tokenize`) would go unseen. These
# stand-ins carry the names that the subclasses' calls arrive with, so the watch knows them too.
inherited = types.SimpleNamespace()


def as_called_on_subclasses(cls, method):
    """Dotted names of stand-ins for the compiled `cls.method` as called on each subclass of cls."""
    names = []
    for subclass in cls.__subclasses__():
        holder = vars(inherited).setdefault(subclass.__name__, types.SimpleNamespace())
        setattr(holder, method, types.SimpleNamespace(__qualname__=f"{subclass.__qualname__}.{method}"))
        names.append(f"{__name__}.inherited.{subclass.__name__}.{method}")
    return names


def ours(*names):
    """This module's own reference code: the kernel imports it too, so it must not answer an exercise."""
    return [f"{__name__}.{name}" for name in names]


ENCODINGS = ["tokenizers.Tokenizer.encode", "tokenizers.Tokenizer.encode_batch",
             "tokenizers.Tokenizer.encode_batch_fast", "tokenizers.Tokenizer.async_encode",
             "tokenizers.Tokenizer.async_encode_batch", "tokenizers.Tokenizer.async_encode_batch_fast"]


TRAINER_SHORTCUTS = ["tokenizers.trainers.BpeTrainer", "tokenizers.Tokenizer.train_from_iterator",
                     "tokenizers.Tokenizer.train",
                     *ours("reference_merges", "is_tie_free", "pair_counts", "_merge_everywhere")]


MODEL_SHORTCUTS = ["tokenizers.models.BPE", "tokenizers.models.WordPiece", "tokenizers.models.Model.tokenize",
                   *as_called_on_subclasses(models.Model, "tokenize"), *ENCODINGS]


# transformers also ships pure-Python copies of both algorithms: several models' tokenizers have a
# `bpe` method (most with the same '</w>' convention), and BERT's legacy tokenizer and a few others
# a WordpieceTokenizer.
BPE_SHORTCUTS = MODEL_SHORTCUTS + [
    f"transformers.models.{model}.tokenization_{model}.{cls}.bpe" for model, cls in [
        ("bertweet", "BertweetTokenizer"), ("biogpt", "BioGptTokenizer"),
        ("blenderbot_small", "BlenderbotSmallTokenizer"), ("clvp", "ClvpTokenizer"), ("ctrl", "CTRLTokenizer"),
        ("flaubert", "FlaubertTokenizer"), ("fsmt", "FSMTTokenizer"), ("phobert", "PhobertTokenizer"),
        ("xlm", "XLMTokenizer")]] + ours(
            "oracle_encode", "bpe_model", "_merge_everywhere")


WORDPIECE_SHORTCUTS = MODEL_SHORTCUTS + [
    f"transformers.models.{module}.WordpieceTokenizer" for module in [
        "bert.tokenization_bert_legacy", "bert_japanese.tokenization_bert_japanese",
        "cpmant.tokenization_cpmant", "prophetnet.tokenization_prophetnet", "tapas.tokenization_tapas"]
] + ours("wordpiece_oracle", "reference_wordpiece")


BERT_SHORTCUTS = [
    "transformers.tokenization_utils_base.PreTrainedTokenizerBase.__call__",
    "transformers.tokenization_utils_base.PreTrainedTokenizerBase.encode",
    "transformers.tokenization_utils_base.PreTrainedTokenizerBase.tokenize",
    "transformers.tokenization_utils_base.PreTrainedTokenizerBase.pad",
    *ENCODINGS,
    # BERT's normalisation and pre-tokenisation (steps 1 and 2 of the exercise), compiled or in Python
    "tokenizers.pre_tokenizers.PreTokenizer.pre_tokenize_str", "tokenizers.pre_tokenizers.PreTokenizer.pre_tokenize",
    *as_called_on_subclasses(pre_tokenizers.PreTokenizer, "pre_tokenize_str"),
    *as_called_on_subclasses(pre_tokenizers.PreTokenizer, "pre_tokenize"),
    *[f"transformers.models.{module}.BasicTokenizer" for module in [
        "bert.tokenization_bert_legacy", "bert_japanese.tokenization_bert_japanese",
        "prophetnet.tokenization_prophetnet", "tapas.tokenization_tapas"]],
    "courselib.tiny_bert.words_of",
]


ORACLE_ADVICE = "the library tokenizer is the oracle the tests compare with, not the answer: write it yourself."


# ---------------------------------------------------------------- seeded inputs (probe and judge)
SYLLABLES = ["ba", "ke", "ro", "ti", "na", "lo", "mi", "su", "de", "po", "ra", "ne"]


PREFIXES = ["", "", "", "un", "re"]


SUFFIXES = ["", "", "s", "ed", "er", "ing", "est", "ly"]


def _index(g, n):
    return int(torch.randint(n, (1,), generator=g))


def _choice(g, options):
    return options[_index(g, len(options))]


def made_up_words(g, count):
    """Distinct word-like strings built from syllables, prefixes and suffixes."""
    words = []
    while len(words) < count:
        stem = "".join(_choice(g, SYLLABLES) for _ in range(1 + _index(g, 2)))
        word = _choice(g, PREFIXES) + stem + _choice(g, SUFFIXES)
        if word not in words:
            words.append(word)
    return words


def zipf_corpus(g, words, num_tokens, words_per_line=9):
    """Lines of `words` whose frequencies fall off like a natural language's (Zipf)."""
    weights = 1.0 / torch.arange(1, len(words) + 1, dtype=torch.float64)
    picks = torch.multinomial(weights, num_tokens, replacement=True, generator=g).tolist()
    tokens = [words[i] for i in picks]
    return [" ".join(tokens[i:i + words_per_line]) for i in range(0, len(tokens), words_per_line)]


def seeded_corpus(seeds, stream, num_words, num_tokens):
    """A Zipf corpus drawn on stream `stream`, of made-up words drawn on stream `stream + 1`."""
    return zipf_corpus(seeds.generator(stream), made_up_words(seeds.generator(stream + 1), num_words), num_tokens)


def random_strings(g, alphabet, count, min_len=1, max_len=9):
    return ["".join(_choice(g, alphabet) for _ in range(min_len + _index(g, max_len - min_len + 1)))
            for _ in range(count)]


# ---------------------------------------------------------------- calling the student's code (probe)
def call_each(fn, calls, name, **watch):
    """`call` for many calls of a function that needs no helpers: fn(*args, **kwargs) for each
    (args, kwargs), quiet and watched, but inside one watch (setting it up costs more than a word's
    tokenization). Returns the results up to the first exception, and the teaching message that
    `call` would have raised for it (None if there was none)."""
    if not callable(fn):
        raise AssertionError(f"{name} should be a function, but it is a {type(fn).__name__}.")
    results, failures = [], []

    def each():
        for args, kwargs in calls:
            try:
                result = fn(*args, **kwargs)
            except (NotImplementedError, Forbidden):
                raise
            except Exception as error:
                shapes = ", ".join(describe(a) for a in args)
                failures.append(f"{name}({shapes}) raised {type(error).__name__}: {error}")
                return
            results.append(list(result) if isinstance(result, list) else result)  # as it was when returned
    call(each, name=name, **watch)
    return results, (failures[0] if failures else None)


# ---------------------------------------------------------------- reading the student's results (probe)
def as_tokens(value, what):
    """The student's tokens as a list of plain strings, or a message saying what they were."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(t, str) for t in value):
        raise AssertionError(f"{what} should return a list of strings (the tokens), "
                             f"but it returned {type(value).__name__}: {value!r:.200}")
    return [str.__str__(t) for t in value]  # numpy's str_ compares equal, but only a str crosses to the grader


def as_merges(value, what):
    if not isinstance(value, (list, tuple)):
        raise AssertionError(f"{what} should return a list of (left, right) pairs, "
                             f"but it returned {type(value).__name__}.")
    merges = []
    for merge in value:
        if (not isinstance(merge, (list, tuple)) or len(merge) != 2
                or not all(isinstance(part, str) for part in merge)):
            raise AssertionError(f"{what}: every merge should be a pair of strings like ('e', 's'), "
                                 f"but one is {merge!r}.")
        merges.append(tuple(str.__str__(part) for part in merge))
    return merges


# ---------------------------------------------------------------- BPE oracles (judge; inputs of bpe_encode)
def word_counts(corpus):
    return Counter(word for line in corpus for word in line.split())


def bpe_model(merges, alphabet):
    """tokenizers' BPE model from `merges`; every character of `alphabet` is a base symbol."""
    vocab = set(alphabet) | {c + END for c in alphabet}
    for left, right in merges:
        vocab |= {left, right, left + right}
    return BPE(vocab={token: i for i, token in enumerate(sorted(vocab))}, merges=list(merges),
               end_of_word_suffix=END, ignore_merges=False)


def oracle_encode(words, merges):
    """{word: tokens} as tokenizers' BPE model splits each word with `merges`."""
    model = bpe_model(merges, {c for word in words for c in word})
    return {word: [token.value for token in model.tokenize(word)] for word in set(words)}


def pair_counts(counts, splits):
    pairs = Counter()
    for word, count in counts.items():
        symbols = splits[word]
        for pair in zip(symbols, symbols[1:]):
            pairs[pair] += count
    return pairs


def reference_merges(corpus, num_merges):
    """The rule as the notebook states it, with every word split by tokenizers' BPE model: merge the
    most frequent adjacent pair (counted inside words, weighted by word frequency), the smallest on a tie."""
    counts = word_counts(corpus)
    merges = []
    for _ in range(num_merges):
        pairs = pair_counts(counts, oracle_encode(counts, merges))
        if not pairs:
            break
        merges.append(min(pairs, key=lambda pair: (-pairs[pair], pair)))
    return merges


def _train(fn, corpus, num_merges):
    return call(fn, list(corpus), num_merges, name="train_bpe", forbidden=TRAINER_SHORTCUTS,
                forbidden_advice="tokenizers' BpeTrainer is the oracle, not the answer: write the loop yourself.")


def _describe(corpus):
    text = " | ".join(corpus)
    return f"train_bpe on {text[:60]!r}{'...' if len(text) > 60 else ''}"


def _merges_of(fn, corpus, num_merges):
    """Probe side: the student's merges for `corpus`, as plain (left, right) tuples."""
    return as_merges(_train(fn, corpus, num_merges), _describe(corpus))


# ---------------------------------------------------------------- exercise 1: train_bpe
FORMAT_CORPUS = (1101, 40, 400)  # stream, number of distinct words, number of running words


@probe
def train_bpe_format(seeds, fn):
    corpus = seeded_corpus(seeds, *FORMAT_CORPUS)
    merges = _train(fn, corpus, 7)
    if not isinstance(merges, list):
        raise AssertionError(f"train_bpe should return a list of merges, but it returned {type(merges).__name__}.")
    for merge in merges:
        if not (isinstance(merge, tuple) and len(merge) == 2 and all(isinstance(s, str) for s in merge)):
            raise AssertionError(f"every merge should be a tuple of two strings like ('e', 's'), but one is {merge!r}.")
    return {"merges": as_merges(merges, "train_bpe"), "no_merges": repr(_train(fn, corpus, 0))[:200]}


def _merge_everywhere(symbols, pair):
    out, i = [], 0
    while i < len(symbols):
        if tuple(symbols[i:i + 2]) == pair:
            out.append(symbols[i] + symbols[i + 1])
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return out


def is_tie_free(corpus, num_merges):
    """Does each of the first num_merges merges have a single most frequent pair? Then BpeTrainer,
    whose tie-break varies between runs, learns the same merges on every run."""
    counts = word_counts(corpus)
    splits = {word: list(word[:-1]) + [word[-1] + END] for word in counts}
    for _ in range(num_merges):
        pairs = pair_counts(counts, splits).most_common(2)
        if not pairs:
            return True
        if len(pairs) == 2 and pairs[0][1] == pairs[1][1]:
            return False
        splits = {word: _merge_everywhere(symbols, pairs[0][0]) for word, symbols in splits.items()}
    return True


# (stream, number of distinct words, number of running words, number of merges)
TIE_FREE = [(1110, 60, 700, 20), (1113, 25, 300, 12), (1119, 40, 400, 13)]


TIE_FREE_ATTEMPTS = 5000


@functools.lru_cache(maxsize=len(TIE_FREE))  # run outside the grader, the probe and the judge share one process
def tie_free_corpus(token, stream, num_words, num_tokens, num_merges):
    """A Zipf corpus on which tokenizers' BpeTrainer is deterministic. Only 2-6 % of these random
    corpora are tie-free, so attempt a draws on the sub-streams "stream.a" and "stream+1.a" of the
    token's seeds until one is (20 to 50 attempts of a few milliseconds, usually); the judge repeats
    the same search."""
    seeds = Seeds(token)
    for attempt in range(TIE_FREE_ATTEMPTS):
        words = made_up_words(seeds.generator(f"{stream + 1}.{attempt}"), num_words)
        corpus = zipf_corpus(seeds.generator(f"{stream}.{attempt}"), words, num_tokens)
        if is_tie_free(corpus, num_merges):
            return tuple(corpus)
    raise RuntimeError(f"no tie-free corpus in {TIE_FREE_ATTEMPTS} attempts: the check's inputs need another design")


@probe
def train_bpe_matches_tokenizers(seeds, fn):
    return [_merges_of(fn, tie_free_corpus(seeds.token, *case), case[-1]) for case in TIE_FREE]


def tie_cases(seeds):
    """(corpus, num_merges): few, repeated words, so that many pairs share the top count."""
    cases = []
    for stream in (1201, 1202, 1203, 1204):
        g = seeds.generator(stream)
        words = random_strings(g, "abcde", 6, min_len=2, max_len=6)
        cases.append(([" ".join(_choice(g, words) for _ in range(6)) for _ in range(2)], 8))
    cases.append((["zy xw zy xw", "vu vu"], 3))  # three pairs tie; the smallest comes last in the text
    return cases


@probe
def train_bpe_breaks_ties_lexicographically(seeds, fn):
    return [_merges_of(fn, corpus, num_merges) for corpus, num_merges in tie_cases(seeds)]


INSIDE_WORDS_CASES = [
    (["o k o k o k", "k o k o"], 3),                                      # one-letter words: nothing to merge
    (["of the cat", "of the hat", "of the mat", "of the bat", "sat"], 6),  # 'f</w>'+'t' crosses words 4 times
    (["the best test", "the rest"], 40),                                  # more merges asked than there are pairs
]


@probe
def train_bpe_stays_inside_words(seeds, fn):
    return [_merges_of(fn, corpus, num_merges) for corpus, num_merges in INSIDE_WORDS_CASES]


# ---------------------------------------------------------------- exercise 2: bpe_encode
def _encodings(fn, cases):
    """Probe side: the student's tokens for each (word, merges), each call with its own copy of merges."""
    results, failure = call_each(fn, [((word, copy.deepcopy(merges)), {}) for word, merges in cases],
                                 "bpe_encode", forbidden=BPE_SHORTCUTS, forbidden_advice=ORACLE_ADVICE)
    tokens = [as_tokens(result, f"bpe_encode({word!r}, merges)") for (word, _), result in zip(cases, results)]
    if failure:
        raise AssertionError(failure)
    return tokens


def known_words_case(seeds):
    """Every word of a corpus, with 25 merges learned from it (the rule, as reference_merges states it)."""
    corpus = seeded_corpus(seeds, 1301, 30, 300)
    return sorted(word_counts(corpus)), reference_merges(corpus, 25)


@probe
def bpe_encode_known_words(seeds, fn):
    words, merges = known_words_case(seeds)
    return _encodings(fn, [(word, merges) for word in words])


def unseen_words_case(seeds):
    """Made-up and random words (letters the merges never saw too), with 40 merges of a corpus."""
    corpus = seeded_corpus(seeds, 1401, 40, 500)
    merges = reference_merges(corpus, 40)
    letters = sorted({c for line in corpus for c in line if c != " "})
    unseen = (made_up_words(seeds.generator(1402), 40) + random_strings(seeds.generator(1403), letters, 60, max_len=12)
              + random_strings(seeds.generator(1404), letters + ["q", "z", "x"], 20) + ["q", "a", "ee", "lolololo"])
    return unseen, merges


@probe
def bpe_encode_matches_tokenizers(seeds, fn):
    words, merges = unseen_words_case(seeds)
    return _encodings(fn, [(word, merges) for word in words])


def priority_cases():
    return [
        # ('b', 'c</w>') outranks ('a', 'b'), though 'a b' comes first in the word.
        ("abc", [("b", "c</w>"), ("a", "b"), ("a", "bc</w>")]),
        ("xabcab", [("c", "a"), ("a", "b"), ("x", "ab"), ("b", "ca"), ("bca", "b</w>")]),
        # the same pair several times, and merges that build on merges
        ("aaaaa", [("a", "a"), ("a", "a</w>"), ("aa", "aa")]),
        ("nanana", [("n", "a"), ("na", "na"), ("na", "na</w>"), ("a", "n")]),
        ("abcab", reference_merges(["ab ab abc abc abc bca bca bca bca cab cab"], 6)),
    ]


@probe
def bpe_encode_applies_merges_by_priority(seeds, fn):
    return _encodings(fn, priority_cases())


# ---------------------------------------------------------------- exercise 3: wordpiece_tokenize
def wordpiece_oracle(word, vocab, unk_token=UNK):
    model = WordPiece(vocab=dict(vocab), unk_token=unk_token, max_input_chars_per_word=100)
    return [token.value for token in model.tokenize(word)]


def random_wordpiece_vocab(seeds, stream, alphabet, unk_token=UNK, size=14):
    """Random pieces (from stream + 1), each a word start or a '##' continuation (from stream)."""
    g = seeds.generator(stream)
    pieces = random_strings(seeds.generator(stream + 1), alphabet, size, max_len=4)
    vocab = {unk_token: 0}
    for piece in pieces:
        vocab.setdefault(piece if _index(g, 2) else "##" + piece, len(vocab))
    return vocab


def _wordpiece_call(word, unk_token):
    return f"wordpiece_tokenize({word!r}, vocab{', unk_token=' + repr(unk_token) if unk_token else ''})"


def _wordpieces(fn, cases):
    """Probe side: the student's pieces for each (word, vocab, unk_token or None) case."""
    calls = [((word, dict(vocab)), {} if unk_token is None else {"unk_token": unk_token})
             for word, vocab, unk_token in cases]
    results, failure = call_each(fn, calls, "wordpiece_tokenize", forbidden=WORDPIECE_SHORTCUTS,
                                 forbidden_advice=ORACLE_ADVICE)
    pieces = [as_tokens(result, _wordpiece_call(word, unk_token))
              for (word, _, unk_token), result in zip(cases, results)]
    if failure:
        raise AssertionError(failure)
    return pieces


def continuation_cases(seeds):
    vocab = {UNK: 0, "ba": 1, "##ke": 2, "##r": 3, "##s": 4, "ke": 5, "r": 6, "##ba": 7, "s": 8, "##er": 9}
    cases = [(word, vocab, None) for word in ["baker", "bakers", "babake", "kebab"[:4], "ker", "baba", "bas"]]
    for stream in (1501, 1502):
        vocab = random_wordpiece_vocab(seeds, stream, "abc", size=18)
        cases += [(word, vocab, None) for word in random_strings(seeds.generator(stream + 2), "abc", 25, max_len=8)]
    return cases


@probe
def wordpiece_continuation_prefix(seeds, fn):
    return _wordpieces(fn, continuation_cases(seeds))


def longest_match_cases(seeds):
    cases = []
    for stream in (1601, 1602, 1603, 1604):
        vocab = random_wordpiece_vocab(seeds, stream, "abcd", size=24)
        cases += [(word, vocab, None) for word in random_strings(seeds.generator(stream + 2), "abcd", 30, max_len=10)]
    return cases


@probe
def wordpiece_longest_match_first(seeds, fn):
    return _wordpieces(fn, longest_match_cases(seeds))


def unknown_word_cases(seeds):
    vocab = {"<unk>": 0, "a": 1, "ab": 2, "##bc": 3, "##d": 4, "b": 5, "##a": 6}
    # greedy does not backtrack: 'ab' + '##c...' fails although 'a' + '##bc' would work
    cases = [(word, vocab, "<unk>") for word in ["abc", "abcd", "xa", "ax", "bcd", "abca"]]
    vocab = random_wordpiece_vocab(seeds, 1701, "abc", unk_token="<oov>", size=16)
    return cases + [(word, vocab, "<oov>") for word in random_strings(seeds.generator(1702), "abcd", 25, max_len=7)]


@probe
def wordpiece_unknown_words(seeds, fn):
    return _wordpieces(fn, unknown_word_cases(seeds))


# ---------------------------------------------------------------- exercise 7: bert_encode_batch
WORDS = ["the", "baker", "bakes", "baked", "bread", "read", "reader", "reading", "unread", "helper",
         "helpers", "kind", "kindness", "new", "newest", "low", "lower", "loaf", "and", "a", "is", "was"]


PIECES = ["bak", "##e", "##es", "##ed", "##er", "##ers", "##ing", "##ness", "##est", "un", "re", "##s", "##ly"]


USUAL_IDS = {PAD: 0, UNK: 100, CLS: 101, SEP: 102, MASK: 103}  # in BERT's own vocab.txt


def shuffled_bert_vocab(g):
    """Tokens as in a BERT vocab.txt, shuffled so that no special token has its usual id."""
    letters = [c for c in string.ascii_lowercase if c != "q"]    # 'q' makes a word unknown
    tokens = ([PAD, UNK, CLS, SEP, MASK] + list(string.punctuation) + list(string.digits) + letters
              + ["##" + c for c in letters] + WORDS + PIECES)
    tokens = [tokens[i] for i in torch.randperm(len(tokens), generator=g).tolist()]
    for token, usual in USUAL_IDS.items():
        if tokens[usual] == token:  # move it one place on (no other special token lands on its usual id)
            tokens[usual], tokens[usual + 1] = tokens[usual + 1], tokens[usual]
    return tokens


def bert_vocab(tokens):
    """{token: id}, the id being the token's line in vocab.txt."""
    return {token: i for i, token in enumerate(tokens)}


def random_texts(g, count):
    extras = ["Baker", "READ", "HeLpErS", "can't", "U.S.", "e-mail", "$42", "snake_case", "(new)", "queen",
              "a,b", "x", "Quick!", "7up", "rebakes", "unkindness"]
    texts = []
    for _ in range(count):
        words = [_choice(g, WORDS + extras) + _choice(g, ["", "", "", ",", ".", "!", "?!", "..."])
                 for _ in range(_index(g, 11))]
        texts.append(_choice(g, [" ", " ", "  ", "\t", "\n"]).join(words))
    return texts


def reference_wordpiece(word, vocab, unk_token=UNK):
    """Handed to bert_encode_batch in place of the student's wordpiece_tokenize (see common.call)."""
    return wordpiece_oracle(word, vocab, unk_token)


def _bert(fn, texts, vocab):
    result = call(fn, list(texts), dict(vocab), name="bert_encode_batch",
                  helpers={"wordpiece_tokenize": reference_wordpiece},
                  forbidden=BERT_SHORTCUTS, forbidden_advice=ORACLE_ADVICE)
    if not isinstance(result, dict) or not {"input_ids", "attention_mask"} <= set(result):
        keys = sorted(result) if isinstance(result, dict) else type(result).__name__
        raise AssertionError("bert_encode_batch should return a dict with the keys 'input_ids' and "
                             f"'attention_mask', but it returned {keys}.")
    for key in ("input_ids", "attention_mask"):
        if not torch.is_tensor(result[key]):
            raise AssertionError(f"{key} should be a torch tensor (B, T), but it is a {type(result[key]).__name__}: "
                                 "build it with torch.tensor or torch.full.")
    return result["input_ids"], result["attention_mask"]


SHAPE_BATCHES = [(1802, 4), (1803, 1), (1804, 6)]  # (stream, number of texts); the vocabulary from 1801


@probe
def bert_encode_batch_shapes(seeds, fn):
    vocab = bert_vocab(shuffled_bert_vocab(seeds.generator(1801)))
    return [_bert(fn, random_texts(seeds.generator(stream), count), vocab) for stream, count in SHAPE_BATCHES]


def id_cases(seeds):
    """(vocabulary tokens, texts): random texts on shuffled vocabularies, then some corner cases."""
    cases = [(shuffled_bert_vocab(seeds.generator(vocab_stream)), random_texts(seeds.generator(text_stream), count))
             for vocab_stream, text_stream, count in [(1901, 1902, 5), (1903, 1904, 3), (1905, 1906, 8)]]
    return cases + [(shuffled_bert_vocab(seeds.generator(1907)),
                     ["", "QUEUE?", "The BAKER's newest, kindest helper (re-)reads 42 recipes..."])]


@probe
def bert_encode_batch_ids(seeds, fn):
    return [_bert(fn, texts, bert_vocab(tokens))[0] for tokens, texts in id_cases(seeds)]


def padding_batches(seeds):
    return [random_texts(seeds.generator(2002), 6), ["Only one text, so no padding at all."],
            ["the bread", "the baker", "a loaf"], ["", "Kindness is new.", "x"]]


@probe
def bert_encode_batch_padding_and_mask(seeds, fn):
    vocab = bert_vocab(shuffled_bert_vocab(seeds.generator(2001)))
    return [_bert(fn, texts, vocab) for texts in padding_batches(seeds)]


COURSE_BYTE_BPE = pathlib.Path(courselib.__file__).resolve().parent / "data" / "tiny_gpt" / "tokenizer.json"


# GPT-2's table is copied in several libraries, and tokenizers and transformers both pre-tokenize and
# decode byte-level BPE in compiled or Python code: any of them would answer exercises 4-6.
BYTE_LEVEL_SHORTCUTS = [
    "transformers.convert_slow_tokenizer.bytes_to_unicode",
    "transformers.models.clvp.tokenization_clvp.bytes_to_unicode",
    "transformers.models.clvp.tokenization_clvp.ClvpTokenizer",
    "bertviz.transformers_neuron_view.tokenization_gpt2.bytes_to_unicode",
    "bertviz.transformers_neuron_view.tokenization_gpt2.GPT2Tokenizer",
    "bertviz.transformers_neuron_view.tokenization_roberta.RobertaTokenizer",
    "tokenizers.pre_tokenizers.ByteLevel.alphabet",
    "tokenizers.pre_tokenizers.PreTokenizer.pre_tokenize_str", "tokenizers.pre_tokenizers.PreTokenizer.pre_tokenize",
    *as_called_on_subclasses(pre_tokenizers.PreTokenizer, "pre_tokenize_str"),
    *as_called_on_subclasses(pre_tokenizers.PreTokenizer, "pre_tokenize"),
    "tokenizers.decoders.Decoder.decode", *as_called_on_subclasses(decoders.Decoder, "decode"),
    "tokenizers.Tokenizer.decode", "tokenizers.Tokenizer.decode_batch", *ENCODINGS,
    "transformers.tokenization_utils_base.PreTrainedTokenizerBase.decode",
    "transformers.tokenization_utils_base.PreTrainedTokenizerBase.batch_decode",
    "transformers.tokenization_utils_base.PreTrainedTokenizerBase.tokenize",
    "courselib.gpt.train_tokenizer",
    *ours("reference_bytes_to_unicode"),
]


BYTE_LEVEL_ADVICE = ("the library's byte-level pre-tokenizer, decoder and table are the oracles the tests compare "
                     "with, not the answer: write it yourself.")


PRINTABLE_BYTES = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]


def reference_bytes_to_unicode():
    """GPT-2's table, handed to the pre-tokenizer and the decoder in place of the student's (see common.call)."""
    moved = [b for b in range(256) if b not in PRINTABLE_BYTES]
    return {**{b: chr(b) for b in PRINTABLE_BYTES}, **{b: chr(256 + n) for n, b in enumerate(moved)}}


@functools.lru_cache(maxsize=1)
def course_byte_bpe():
    """The course's byte-level BPE (trained on the stories of courselib.gpt), probe and judge alike."""
    return Tokenizer.from_file(str(COURSE_BYTE_BPE))


class _Each:
    """fn(*args) for each args, inside one `call` (one watch, helpers swapped once). It carries fn's
    globals, so that `call` swaps helpers into the student's namespace. Keeps the results up to the
    first exception, and a teaching message for that exception."""

    HINTS = {UnicodeDecodeError: " Bytes cut in the middle of a character are not valid UTF-8: decode with "
                                 "errors='replace', which turns each broken sequence into '\ufffd'.",
             KeyError: " Every character of a token stands for one byte: look it up in the inverse of "
                       "bytes_to_unicode(), and every byte of piece.encode('utf-8') in bytes_to_unicode()."}

    def __init__(self, fn, calls, name):
        self.fn, self.calls, self.name = fn, calls, name
        self.results, self.failure = [], None
        if hasattr(fn, "__globals__"):
            self.__globals__ = fn.__globals__

    def __call__(self):
        for args in self.calls:
            try:
                result = self.fn(*args)
            except (NotImplementedError, Forbidden):
                raise
            except Exception as error:
                hint = next((h for kind, h in self.HINTS.items() if isinstance(error, kind)), "")
                self.failure = (f"{self.name}({', '.join(f'{a!r:.80}' for a in args)}) raised "
                                f"{type(error).__name__}: {error}.{hint}")
                return
            self.results.append(list(result) if isinstance(result, list) else result)


def _run_each(fn, calls, name):
    if not callable(fn):
        raise AssertionError(f"{name} should be a function, but it is a {type(fn).__name__}.")
    each = _Each(fn, calls, name)
    call(each, name=name, helpers={"bytes_to_unicode": reference_bytes_to_unicode},
         forbidden=BYTE_LEVEL_SHORTCUTS, forbidden_advice=BYTE_LEVEL_ADVICE)
    return each


# ---- exercise 4: bytes_to_unicode
def _student_table(fn):
    """Probe side: the student's table as [(byte, character)] pairs of plain ints and strings."""
    table = call(fn, name="bytes_to_unicode", forbidden=BYTE_LEVEL_SHORTCUTS, forbidden_advice=BYTE_LEVEL_ADVICE)
    if not isinstance(table, dict):
        raise AssertionError(f"bytes_to_unicode() should return a dict {{byte: character}}, not a {type(table).__name__}.")
    return [(int(key) if isinstance(key, int) and not isinstance(key, bool) else repr(key)[:40],
             str.__str__(value) if isinstance(value, str) else repr(value)[:40]) for key, value in table.items()]


@probe
def bytes_to_unicode_printable_bijection(seeds, fn):
    return _student_table(fn)


@probe
def bytes_to_unicode_matches_gpt2(seeds, fn):
    return _student_table(fn)


# ---- exercise 5: byte_level_pretokenize
ASCII_ATOMS = ([" "] * 6 + ["  ", "   ", "\n", "\n\n", "\t", " \n", "\r\n", "  \t "]
               + [".", ",", "!", "?!", "...", "(", ")", "-", "'", '"', "$", "42", "2026", "3.14", "_"]
               + ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL"])


UNICODE_ATOMS = (["é", "e\u0301", "ñ", "n\u0303", "ü", "Å", "ç", "ø", "ß", "Œ", "café", "naïve", "Ångström"]
                 + ["私", "パン", "好き", "中文", "한국어", "。", "、"]
                 + ["😀", "👍🏽", "👩\u200d👩\u200d👧", "🇫🇷", "❤️", "🍞", "🥐🥖"]
                 + ["½", "²", "٣", "Ⅻ", "१२", "€", "©", "—", "…", "«", "»", "→", "\u00a0", "\u3000"])


def seeded_texts(g, count, atoms, max_atoms=14):
    """Texts of up to max_atoms atoms; some words are capitalised."""
    texts = []
    for _ in range(count):
        parts = [_choice(g, atoms) for _ in range(_index(g, max_atoms + 1))]
        texts.append("".join(p.capitalize() if _index(g, 4) == 0 else p for p in parts))
    return texts


def ascii_texts(seeds):
    words = made_up_words(seeds.generator(2102), 12)
    return (["", " ", "   ", "\n", "x", "  a", "b  ", "one  two   three", "Tab\tand\nnewline"]
            + seeded_texts(seeds.generator(2101), 40, ASCII_ATOMS + words * 2))


def unicode_texts(seeds):
    words = made_up_words(seeds.generator(2202), 8)
    return (["e\u0301", "🇫🇷", " 🍞🍞", "٣½", "\u3000パン", "Crème brûlée 🍮 !"]
            + seeded_texts(seeds.generator(2201), 45, UNICODE_ATOMS + ASCII_ATOMS + words))


def _pieces(fn, texts):
    each = _run_each(fn, [(text,) for text in texts], "byte_level_pretokenize")
    pieces = [as_tokens(result, f"byte_level_pretokenize({text!r:.80})") for text, result in zip(texts, each.results)]
    if each.failure:
        raise AssertionError(each.failure)
    return pieces


@probe
def byte_level_pretokenize_words_and_spaces(seeds, fn):
    return _pieces(fn, ascii_texts(seeds))


@probe
def byte_level_pretokenize_unicode(seeds, fn):
    return _pieces(fn, unicode_texts(seeds))


# ---- exercise 6: byte_level_decode
def round_trip_cases(seeds):
    """(tokens, how they were made): the course BPE's tokens of seeded texts, and one token per byte."""
    bpe = course_byte_bpe()
    texts = unicode_texts(seeds)[6:] + seeded_texts(seeds.generator(2301), 10, UNICODE_ATOMS)
    table = reference_bytes_to_unicode()
    cases = [(bpe.encode(text).tokens, "BPE") for text in texts]
    cases += [(["".join(table[b] for b in text.encode("utf-8")) for text in texts[:6]], "pieces")]
    return cases + [([table[b] for b in text.encode("utf-8")], "bytes") for text in texts[6:12]] + [([], "empty")]


def cut_cases(seeds):
    """Token lists cut inside characters, and random bytes: not all of it valid UTF-8."""
    bpe = course_byte_bpe()
    g = seeds.generator(2401)
    table = reference_bytes_to_unicode()
    cases = []
    for text in seeded_texts(seeds.generator(2402), 25, UNICODE_ATOMS, max_atoms=8):
        tokens = [table[b] for b in text.encode("utf-8")] if _index(g, 3) == 0 else bpe.encode(text).tokens
        start = _index(g, len(tokens) + 1)
        cases.append(tokens[start:start + 1 + _index(g, 4)])
    for _ in range(10):
        cases.append([table[int(b)] for b in torch.randint(256, (1 + _index(g, 8),), generator=g)])
    return cases + [[table[0xF0], table[0x9F]], [table[0xC3]], [table[0xA9], "a"]]


def _decoded(fn, cases):
    each = _run_each(fn, [(list(tokens),) for tokens in cases], "byte_level_decode")
    for tokens, result in zip(cases, each.results):
        if not isinstance(result, str):
            raise AssertionError(f"byte_level_decode({tokens!r:.80}) should return a str, not a "
                                 f"{type(result).__name__}: {result!r:.80}")
    if each.failure:
        raise AssertionError(each.failure)
    return [str.__str__(result) for result in each.results]


@probe
def byte_level_decode_round_trip(seeds, fn):
    return _decoded(fn, [tokens for tokens, _ in round_trip_cases(seeds)])


@probe
def byte_level_decode_cut_characters(seeds, fn):
    return _decoded(fn, cut_cases(seeds))


UNIGRAM_TIE_GAP = 1e-6  # the best split of every hidden word beats the second best by more than this


UNIGRAM_SHORTCUTS = (["tokenizers.models.Unigram", "tokenizers.models.Model.tokenize",
                      *as_called_on_subclasses(models.Model, "tokenize"), *ENCODINGS,
                      "sentencepiece.SentencePieceProcessor"]
                     + ours("top_two_totals", "greedy_split"))


UNIGRAM_ADVICE = ("tokenizers' Unigram model (and SentencePiece) is the oracle the tests compare with, not the answer: "
                  "write the dynamic programme yourself.")


def top_two_totals(word, log_probs):
    """The two largest totals of log-probabilities over all splits of word into pieces of log_probs
    (fewer if there are fewer splits): the best two paths to each position, extended piece by piece.
    Used to choose hidden words whose best split has no (near) tie."""
    best = [[0.0]] + [[] for _ in word]
    for end in range(1, len(word) + 1):
        totals = [total + log_probs[word[start:end]]
                  for start in range(end) if word[start:end] in log_probs for total in best[start]]
        best[end] = sorted(totals, reverse=True)[:2]
    return best[-1]


def greedy_split(word, log_probs):
    """WordPiece's rule without '##': the longest piece at each position; None at a dead end."""
    pieces, start = [], 0
    while start < len(word):
        end = next((e for e in range(len(word), start, -1) if word[start:e] in log_probs), None)
        if end is None:
            return None
        pieces.append(word[start:end])
        start = end
    return pieces


def random_unigram_vocab(g, alphabet, size, single_letters):
    """{piece: log-probability} of random pieces of 2-4 letters, probabilities summing to 1 (a softmax
    of Gaussian logits: a few likely pieces, many rare ones); with every letter of alphabet as a piece
    if single_letters, so that every word has a split, else with no piece of one letter, so that some
    positions of a word are reached by no split."""
    pieces = set(random_strings(g, alphabet, size, min_len=2, max_len=4))
    pieces = sorted(pieces | set(alphabet) if single_letters else pieces)
    log_probs = torch.log_softmax(2 * torch.randn(len(pieces), generator=g, dtype=torch.float64), dim=0)
    return dict(zip(pieces, log_probs.tolist()))


def words_from_pieces(g, log_probs, count, keep=lambda word: True, max_pieces=4, attempts=2000):
    """Up to count distinct words, each 1-max_pieces random pieces of log_probs joined (so a split exists),
    whose best split has no tie within UNIGRAM_TIE_GAP, and that keep(word) accepts."""
    pieces, words = sorted(log_probs), []
    for _ in range(attempts):
        word = "".join(_choice(g, pieces) for _ in range(1 + _index(g, max_pieces)))
        totals = top_two_totals(word, log_probs)
        if word not in words and (len(totals) < 2 or totals[0] - totals[1] > UNIGRAM_TIE_GAP) and keep(word):
            words.append(word)
            if len(words) == count:
                break
    return words


def unigram_match_cases(seeds):
    """(word, log_probs): seeded vocabularies, two with every letter as a piece, two without."""
    cases = []
    for stream, alphabet, size, single_letters in [(2501, "abcd", 16, True), (2502, "abcde", 24, True),
                                                   (2503, "abcd", 18, False), (2504, "abcde", 26, False)]:
        g = seeds.generator(stream)
        log_probs = random_unigram_vocab(g, alphabet, size, single_letters)
        cases += [(word, log_probs) for word in words_from_pieces(g, log_probs, 25)]
    return cases


def greedy_cases(seeds):
    """(word, log_probs, whether a split exists): words that greedy longest-match splits worse than
    the best split, or not at all although a split exists; and words that no pieces spell."""
    cases = [("abc", {"a": -2.0, "ab": -1.0, "bc": -1.0}, True),       # greedy: 'ab', then no piece for 'c'
             ("abcd", {"abc": -9.0, "ab": -2.0, "cd": -2.0, "d": -1.0}, True),
             ("aba", {"ab": -1.0, "ba": -1.0}, False),                # every letter is in a piece, yet no split
             ("abz", {"a": -1.0, "b": -1.0, "ab": -1.5}, False),       # 'z' is in no piece
             ("a", {}, False)]
    for stream, single_letters in [(2601, True), (2602, True), (2603, False)]:
        g = seeds.generator(stream)
        log_probs = random_unigram_vocab(g, "abcd", 20, single_letters)

        def greedy_loses(word):
            greedy = greedy_split(word, log_probs)
            return greedy is None or sum(log_probs[p] for p in greedy) < top_two_totals(word, log_probs)[0] - 1e-9
        cases += [(word, log_probs, True) for word in words_from_pieces(g, log_probs, 8, keep=greedy_loses)]
    g = seeds.generator(2604)
    log_probs = random_unigram_vocab(g, "abcd", 12, single_letters=False)  # most random strings have no split
    unsplittable = [w for w in random_strings(g, "abcd", 60, min_len=2, max_len=8) if not top_two_totals(w, log_probs)]
    cases += [(word, log_probs, False) for word in sorted(set(unsplittable))[:8]]
    return cases


class _Segmentations:
    """unigram_segment(word, log_probs) for each case inside one `call` (one watch), each with its own
    copy of log_probs; keeps what each call returned or raised."""

    def __init__(self, fn, cases):
        self.fn, self.cases, self.outcomes = fn, cases, []
        if hasattr(fn, "__globals__"):
            self.__globals__ = fn.__globals__

    def __call__(self):
        for word, log_probs in self.cases:
            try:
                result = self.fn(word, dict(log_probs))
            except (NotImplementedError, Forbidden):
                raise
            except Exception as error:  # the judge decides whether raising was right
                self.outcomes.append({"raised": type(error).__name__, "value_error": isinstance(error, ValueError),
                                      "message": str(error)[:300]})
                continue
            what = f"unigram_segment({word!r}, log_probs)"
            self.outcomes.append({"pieces": as_tokens(result, what)})


def _segment_all(fn, cases):
    """Probe side: what the student's unigram_segment did for each (word, log_probs)."""
    if not callable(fn):
        raise AssertionError(f"unigram_segment should be a function, but it is a {type(fn).__name__}.")
    each = _Segmentations(fn, cases)
    call(each, name="unigram_segment", forbidden=UNIGRAM_SHORTCUTS, forbidden_advice=UNIGRAM_ADVICE)
    return each.outcomes


@probe
def stretch_unigram_segment_matches_tokenizers(seeds, fn):
    return _segment_all(fn, unigram_match_cases(seeds))


@probe
def stretch_unigram_segment_beats_greedy(seeds, fn):
    return _segment_all(fn, [(word, log_probs) for word, log_probs, _ in greedy_cases(seeds)])
