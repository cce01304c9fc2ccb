"""Hidden checks for 01_tokenization. Each public function is one grade cell's hidden part.

Layered as the course's tests are: the format first, then values on seeded corpora and vocabularies
against independent oracles, then behaviour. The oracles are Hugging Face's own implementations:
- `tokenizers.trainers.BpeTrainer` for `train_bpe`, on corpora whose first merges have no ties
  (its tie-break follows token ids, not strings, and varies between runs). Tie-breaking is checked
  against the rule as stated, with the pairs counted on words split by `tokenizers`' BPE model;
- `tokenizers.models.BPE(end_of_word_suffix="</w>")` for `bpe_encode`;
- `tokenizers.models.WordPiece` for `wordpiece_tokenize`;
- `transformers.BertTokenizerFast(vocab=<vocab.txt>)` for `bert_encode_batch`.
A mismatch is explained by naming the misconception whose output it matches, when one does.
Seeds here are never used by the visible tests.
"""
import copy
import json
import pathlib
import string
import tempfile
from collections import Counter

import torch
from tokenizers import Tokenizer, pre_tokenizers, trainers
from tokenizers.models import BPE, WordPiece

from autograder.checks.common import call, expect_close, expect_shape, generator

END = "</w>"
PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"

TRAINER_SHORTCUTS = ["tokenizers.trainers.BpeTrainer", "tokenizers.Tokenizer.train_from_iterator"]
MODEL_SHORTCUTS = ["tokenizers.models.BPE", "tokenizers.models.WordPiece", "tokenizers.models.Model.tokenize"]
BERT_SHORTCUTS = [
    "transformers.tokenization_utils_base.PreTrainedTokenizerBase.__call__",
    "transformers.tokenization_utils_base.PreTrainedTokenizerBase.encode",
    "transformers.tokenization_utils_base.PreTrainedTokenizerBase.tokenize",
    "transformers.tokenization_utils_base.PreTrainedTokenizerBase.pad",
    "tokenizers.Tokenizer.encode",
    "tokenizers.Tokenizer.encode_batch",
]
ORACLE_ADVICE = "the library tokenizer is the oracle the tests compare with, not the answer: write it yourself."


# ---------------------------------------------------------------- seeded inputs
SYLLABLES = ["ba", "ke", "ro", "ti", "na", "lo", "mi", "su", "de", "po", "ra", "ne"]
PREFIXES = ["", "", "", "un", "re"]
SUFFIXES = ["", "", "s", "ed", "er", "ing", "est", "ly"]


def _index(g, n):
    return int(torch.randint(n, (1,), generator=g))


def _choice(g, options):
    return options[_index(g, len(options))]


def made_up_words(seed, count):
    """Distinct word-like strings built from syllables, prefixes and suffixes."""
    g = generator(seed)
    words = []
    while len(words) < count:
        stem = "".join(_choice(g, SYLLABLES) for _ in range(1 + _index(g, 2)))
        word = _choice(g, PREFIXES) + stem + _choice(g, SUFFIXES)
        if word not in words:
            words.append(word)
    return words


def zipf_corpus(seed, num_words, num_tokens, words_per_line=9):
    """Lines of made-up words whose frequencies fall off like a natural language's (Zipf)."""
    g = generator(seed)
    words = made_up_words(seed + 1, num_words)
    weights = 1.0 / torch.arange(1, num_words + 1, dtype=torch.float64)
    picks = torch.multinomial(weights, num_tokens, replacement=True, generator=g).tolist()
    tokens = [words[i] for i in picks]
    return [" ".join(tokens[i:i + words_per_line]) for i in range(0, len(tokens), words_per_line)]


def random_strings(seed, alphabet, count, min_len=1, max_len=9):
    g = generator(seed)
    return ["".join(_choice(g, alphabet) for _ in range(min_len + _index(g, max_len - min_len + 1)))
            for _ in range(count)]


# ---------------------------------------------------------------- comparing tokens and merges
def as_tokens(value, what):
    """The student's tokens as a list of strings, or a message saying what they were."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(t, str) for t in value):
        raise AssertionError(f"{what} should return a list of strings (the tokens), "
                             f"but it returned {type(value).__name__}: {value!r:.200}")
    return list(value)


def expect_tokens(actual, expected, what, hint="", diagnoses=None):
    actual = as_tokens(actual, what)
    if actual == list(expected):
        return
    for misconception, wrong in (diagnoses or {}).items():
        if actual == list(wrong):
            raise AssertionError(f"{what} returned {actual}, expected {list(expected)}: {misconception}")
    raise AssertionError(f"{what} returned {actual}, expected {list(expected)}. {hint}".strip())


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
        merges.append(tuple(merge))
    return merges


# ---------------------------------------------------------------- BPE oracles
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


def trainer_merges(corpus, num_merges):
    """The merges tokenizers' BpeTrainer learns (whitespace split, '</w>' glued to the last character)."""
    tokenizer = Tokenizer(BPE(end_of_word_suffix=END))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.BpeTrainer(vocab_size=100_000, min_frequency=0, show_progress=False,
                                  end_of_word_suffix=END)
    tokenizer.train_from_iterator(corpus, trainer)
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    return [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges][:num_merges]


def explain_merge(counts, earlier, mine, right, step):
    """Why merge number `step` should be `right` and not `mine`, given the same earlier merges."""
    head = f"merge {step} is {mine}, but it should be {right}: "
    if END in mine:
        return head + ("'</w>' is glued to the last character of a word ('low' starts as "
                       "['l', 'o', 'w</w>']), not a separate symbol.")
    if END in mine[0] or END in mine[1][:-len(END)]:
        return head + ("it joins the end of one word to the start of the next. Count pairs inside each "
                       "word only: a space is a hard word boundary.")
    splits = oracle_encode(counts, earlier)
    pairs = pair_counts(counts, splits)
    if mine not in pairs:
        return head + (f"{mine} is not an adjacent pair inside any word after the first {step} merges. "
                       "Apply each merge to every word before counting pairs again, and glue '</w>' "
                       "to the last character.")
    once_each = pair_counts({word: 1 for word in counts}, splits)
    if pairs[mine] == pairs[right]:
        return head + (f"both occur {pairs[right]} times. On a tie the smallest pair wins: "
                       f"{right} < {mine} (compare the tuples, as min() does).")
    if pairs[mine] < pairs[right] and once_each[mine] >= once_each[right]:
        return head + (f"{right} occurs {pairs[right]} times in the corpus and {mine} only {pairs[mine]}. "
                       "Weight each word's pairs by how often the word appears (its frequency), "
                       "not once per distinct word.")
    return head + (f"{right} occurs {pairs[right]} times and {mine} {pairs[mine]} times: merge the most "
                   "frequent pair.")


def expect_merges(actual, expected, corpus, what):
    actual = as_merges(actual, what)
    if actual == expected:
        return
    counts = word_counts(corpus)
    for step, (mine, right) in enumerate(zip(actual, expected)):
        if mine != right:
            raise AssertionError(f"{what}: " + explain_merge(counts, expected[:step], mine, right, step))
    if len(actual) < len(expected):
        raise AssertionError(f"{what} returned {len(actual)} merges, expected {len(expected)}: "
                             "keep merging until num_merges merges are learned.")
    raise AssertionError(f"{what} returned {len(actual)} merges, but after {len(expected)} every word "
                         "is a single symbol: stop early when no pair is left.")


def _train(fn, corpus, num_merges):
    return call(fn, list(corpus), num_merges, name="train_bpe", forbidden=TRAINER_SHORTCUTS,
                forbidden_advice="tokenizers' BpeTrainer is the oracle, not the answer: write the loop yourself.")


def _describe(corpus):
    text = " | ".join(corpus)
    return f"train_bpe on {text[:60]!r}{'...' if len(text) > 60 else ''}"


# ---------------------------------------------------------------- exercise 1: train_bpe
# Corpora whose first merges have a single most frequent pair at every step (checked when written),
# so tokenizers' BpeTrainer is deterministic and its merges are the answer whatever the tie-break.
TIE_FREE = [(1110, 60, 700, 20), (1113, 25, 300, 12), (1119, 40, 400, 13)]


def train_bpe_format(fn):
    corpus = zipf_corpus(1101, 40, 400)
    merges = _train(fn, corpus, 7)
    if not isinstance(merges, list):
        raise AssertionError(f"train_bpe should return a list of merges, but it returned {type(merges).__name__}.")
    if len(merges) != 7:
        raise AssertionError(f"train_bpe(corpus, 7) returned {len(merges)} merges: return exactly num_merges "
                             "merges while pairs are left.")
    for merge in merges:
        if not (isinstance(merge, tuple) and len(merge) == 2 and all(isinstance(s, str) for s in merge)):
            raise AssertionError(f"every merge should be a tuple of two strings like ('e', 's'), but one is {merge!r}.")
    counts = word_counts(corpus)
    symbols = {c for word in counts for c in word} | {word[-1] + END for word in counts}  # where merging starts
    for step, (left, right) in enumerate(merges):
        for part in (left, right):
            if part == END:
                raise AssertionError(f"merge {step} {(left, right)} uses '</w>' on its own: '</w>' is glued to "
                                     "the last character of a word ('low' starts as ['l', 'o', 'w</w>']).")
            if part not in symbols:
                raise AssertionError(f"merge {step} {(left, right)} uses {part!r}, which is neither a starting "
                                     "symbol of this corpus (a character, or a last character + '</w>') nor "
                                     "made by an earlier merge.")
        symbols.add(left + right)
    if _train(fn, corpus, 0) != []:
        raise AssertionError("train_bpe(corpus, 0) should return [] (no merges).")


def train_bpe_matches_tokenizers(fn):
    for seed, num_words, num_tokens, num_merges in TIE_FREE:
        corpus = zipf_corpus(seed, num_words, num_tokens)
        expected = trainer_merges(corpus, num_merges)
        expect_merges(_train(fn, corpus, num_merges), expected, corpus, _describe(corpus))


def train_bpe_breaks_ties_lexicographically(fn):
    # Few, repeated words: many pairs share the top count.
    for seed in (1201, 1202, 1203, 1204):
        g = generator(seed)
        words = random_strings(seed, "abcde", 6, min_len=2, max_len=6)
        corpus = [" ".join(_choice(g, words) for _ in range(6)) for _ in range(2)]
        expect_merges(_train(fn, corpus, 8), reference_merges(corpus, 8), corpus, _describe(corpus))
    corpus = ["zy xw zy xw", "vu vu"]   # three pairs tie; the smallest comes last in the text
    expect_merges(_train(fn, corpus, 3), reference_merges(corpus, 3), corpus, _describe(corpus))


def train_bpe_stays_inside_words(fn):
    cases = [
        ["o k o k o k", "k o k o"],                        # one-letter words: nothing to merge
        ["of the cat", "of the hat", "of the mat", "of the bat", "sat"],  # 'f</w>'+'t' crosses words 4 times
        ["the best test", "the rest"],                    # asks for more merges than there are pairs
    ]
    for corpus, num_merges in zip(cases, (3, 6, 40)):
        expected = reference_merges(corpus, num_merges)
        expect_merges(_train(fn, corpus, num_merges), expected, corpus, _describe(corpus))


# ---------------------------------------------------------------- exercise 2: bpe_encode
def _encode(fn, word, merges):
    return call(fn, word, copy.deepcopy(merges), name="bpe_encode", forbidden=MODEL_SHORTCUTS,
                forbidden_advice=ORACLE_ADVICE)


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


def _by_rank(symbols, merges):
    rank = {pair: i for i, pair in enumerate(merges)}
    while True:
        present = [pair for pair in zip(symbols, symbols[1:]) if pair in rank]
        if not present:
            return symbols
        symbols = _merge_everywhere(symbols, min(present, key=rank.get))


def encode_diagnoses(word, merges):
    """What a buggy bpe_encode returns, keyed by the misconception."""
    start = list(word[:-1]) + [word[-1] + END]
    left_to_right = list(start)
    known = set(merges)
    while True:
        found = next((i for i, pair in enumerate(zip(left_to_right, left_to_right[1:])) if pair in known), None)
        if found is None:
            break
        left_to_right[found:found + 2] = [left_to_right[found] + left_to_right[found + 1]]
    once = list(start)
    for pair in merges:
        for i in range(len(once) - 1):
            if (once[i], once[i + 1]) == pair:
                once[i:i + 2] = [once[i] + once[i + 1]]
                break
    return {
        "you merged the first known pair from the left; apply the pair with the best (lowest) rank "
        "in merges first, wherever it is in the word (merges are applied by priority).": left_to_right,
        "each merge was applied to its first occurrence only; merge every occurrence of the pair.": once,
        "your tokens have no end-of-word marker: start from the characters with '</w>' glued to the "
        "last one.": _by_rank(list(word), merges),
        "'</w>' is glued to the last character ('w</w>'), not a separate symbol.": _by_rank(list(word) + [END], merges),
    }


def _expect_encoding(fn, word, merges, expected):
    tokens = as_tokens(_encode(fn, word, merges), f"bpe_encode({word!r}, merges)")
    if "".join(tokens) != word + END and tokens not in encode_diagnoses(word, merges).values():
        raise AssertionError(f"bpe_encode({word!r}, merges) returned {tokens}; joined together, the tokens "
                             f"must spell the word followed by '</w>' ({word + END!r}).")
    expect_tokens(tokens, expected, f"bpe_encode({word!r}, merges)",
                  "tokenizers' BPE model (end_of_word_suffix='</w>') splits it that way.",
                  diagnoses=encode_diagnoses(word, merges))


def bpe_encode_known_words(fn):
    corpus = zipf_corpus(1301, 30, 300)
    merges = reference_merges(corpus, 25)
    words = sorted(word_counts(corpus))
    expected = oracle_encode(words, merges)
    for word in words:
        _expect_encoding(fn, word, merges, expected[word])


def bpe_encode_matches_tokenizers(fn):
    corpus = zipf_corpus(1401, 40, 500)
    merges = reference_merges(corpus, 40)
    letters = sorted({c for line in corpus for c in line if c != " "})
    unseen = (made_up_words(1402, 40) + random_strings(1403, letters, 60, max_len=12)
              + random_strings(1404, letters + ["q", "z", "x"], 20) + ["q", "a", "ee", "lolololo"])
    expected = oracle_encode(unseen, merges)
    for word in unseen:
        _expect_encoding(fn, word, merges, expected[word])


def bpe_encode_applies_merges_by_priority(fn):
    cases = [
        # ('b', 'c</w>') outranks ('a', 'b'), though 'a b' comes first in the word.
        ("abc", [("b", "c</w>"), ("a", "b"), ("a", "bc</w>")]),
        ("xabcab", [("c", "a"), ("a", "b"), ("x", "ab"), ("b", "ca"), ("bca", "b</w>")]),
        # the same pair several times, and merges that build on merges
        ("aaaaa", [("a", "a"), ("a", "a</w>"), ("aa", "aa")]),
        ("nanana", [("n", "a"), ("na", "na"), ("na", "na</w>"), ("a", "n")]),
    ]
    corpus = ["ab ab abc abc abc bca bca bca bca cab cab"]
    cases.append(("abcab", reference_merges(corpus, 6)))
    for word, merges in cases:
        _expect_encoding(fn, word, merges, oracle_encode([word], merges)[word])


# ---------------------------------------------------------------- exercise 3: wordpiece_tokenize
def wordpiece_oracle(word, vocab, unk_token=UNK):
    model = WordPiece(vocab=dict(vocab), unk_token=unk_token, max_input_chars_per_word=100)
    return [token.value for token in model.tokenize(word)]


def wordpiece_diagnoses(word, vocab, unk_token=UNK):
    def greedy(shortest=False, prefix="##", partial=False):
        pieces, start = [], 0
        while start < len(word):
            ends = range(start + 1, len(word) + 1) if shortest else range(len(word), start, -1)
            end = next((e for e in ends if (word[start:e] if start == 0 else prefix + word[start:e]) in vocab), None)
            if end is None:
                return pieces + [unk_token] if partial else [unk_token]
            pieces.append(word[start:end] if start == 0 else prefix + word[start:end])
            start = end
        return pieces
    def backtracking(start=0):
        if start == len(word):
            return []
        for end in range(len(word), start, -1):
            piece = word[start:end] if start == 0 else "##" + word[start:end]
            if piece in vocab:
                rest = backtracking(end)
                if rest is not None:
                    return [piece] + rest
        return None

    searched = backtracking()
    return {
        "WordPiece is greedy and never goes back: once the longest piece is taken, a dead end later makes "
        "the whole word unknown, even if a shorter piece would have worked.": searched if searched else None,
        "you took the shortest piece in the vocabulary; WordPiece takes the longest prefix that is in "
        "the vocabulary (greedy longest-match-first).": greedy(shortest=True),
        "pieces after the first must carry the '##' prefix: look up and return '##' + piece.": greedy(prefix=""),
        "when the rest of a word can't be split, the whole word becomes the unknown token, not just "
        "the part that failed.": greedy(partial=True),
        "on failure return unk_token, the argument, not a hard-coded '[UNK]'.":
            [UNK] if wordpiece_oracle(word, vocab, unk_token) == [unk_token] and unk_token != UNK else None,
    }


def random_wordpiece_vocab(seed, alphabet, unk_token=UNK, size=14):
    g = generator(seed)
    pieces = random_strings(seed + 1, alphabet, size, max_len=4)
    vocab = {unk_token: 0}
    for piece in pieces:
        vocab.setdefault(piece if _index(g, 2) else "##" + piece, len(vocab))
    return vocab


def _wordpiece(fn, word, vocab, **kwargs):
    return call(fn, word, dict(vocab), name="wordpiece_tokenize", forbidden=MODEL_SHORTCUTS,
                forbidden_advice=ORACLE_ADVICE, **kwargs)


def _expect_wordpiece(fn, word, vocab, unk_token=None):
    kwargs = {} if unk_token is None else {"unk_token": unk_token}
    unk = UNK if unk_token is None else unk_token
    what = f"wordpiece_tokenize({word!r}, vocab{', unk_token=' + repr(unk_token) if unk_token else ''})"
    expect_tokens(_wordpiece(fn, word, vocab, **kwargs), wordpiece_oracle(word, vocab, unk), what,
                  "tokenizers' WordPiece splits it that way: at each position take the longest piece in "
                  "the vocabulary ('##' + piece after the first).",
                  diagnoses={k: v for k, v in wordpiece_diagnoses(word, vocab, unk).items() if v is not None})


def wordpiece_continuation_prefix(fn):
    vocab = {UNK: 0, "ba": 1, "##ke": 2, "##r": 3, "##s": 4, "ke": 5, "r": 6, "##ba": 7, "s": 8, "##er": 9}
    for word in ["baker", "bakers", "babake", "kebab"[:4], "ker", "baba", "bas"]:
        _expect_wordpiece(fn, word, vocab)
    for seed in (1501, 1502):
        vocab = random_wordpiece_vocab(seed, "abc", size=18)
        for word in random_strings(seed + 2, "abc", 25, max_len=8):
            _expect_wordpiece(fn, word, vocab)


def wordpiece_longest_match_first(fn):
    for seed in (1601, 1602, 1603, 1604):
        vocab = random_wordpiece_vocab(seed, "abcd", size=24)
        for word in random_strings(seed + 2, "abcd", 30, max_len=10):
            _expect_wordpiece(fn, word, vocab)


def wordpiece_unknown_words(fn):
    vocab = {"<unk>": 0, "a": 1, "ab": 2, "##bc": 3, "##d": 4, "b": 5, "##a": 6}
    # greedy does not backtrack: 'ab' + '##c...' fails although 'a' + '##bc' would work
    for word in ["abc", "abcd", "xa", "ax", "bcd", "abca"]:
        _expect_wordpiece(fn, word, vocab, unk_token="<unk>")
    vocab = random_wordpiece_vocab(1701, "abc", unk_token="<oov>", size=16)
    for word in random_strings(1702, "abcd", 25, max_len=7):
        _expect_wordpiece(fn, word, vocab, unk_token="<oov>")


# ---------------------------------------------------------------- exercise 4: bert_encode_batch
WORDS = ["the", "baker", "bakes", "baked", "bread", "read", "reader", "reading", "unread", "helper",
         "helpers", "kind", "kindness", "new", "newest", "low", "lower", "loaf", "and", "a", "is", "was"]
PIECES = ["bak", "##e", "##es", "##ed", "##er", "##ers", "##ing", "##ness", "##est", "un", "re", "##s", "##ly"]


def shuffled_bert_vocab(seed):
    """Tokens as in a BERT vocab.txt, shuffled so that no special token has its usual id."""
    letters = [c for c in string.ascii_lowercase if c != "q"]    # 'q' makes a word unknown
    tokens = ([PAD, UNK, CLS, SEP, MASK] + list(string.punctuation) + list(string.digits) + letters
              + ["##" + c for c in letters] + WORDS + PIECES)
    order = torch.randperm(len(tokens), generator=generator(seed)).tolist()
    return [tokens[i] for i in order]


def random_texts(seed, count):
    g = generator(seed)
    extras = ["Baker", "READ", "HeLpErS", "can't", "U.S.", "e-mail", "$42", "snake_case", "(new)", "queen",
              "a,b", "x", "Quick!", "7up", "rebakes", "unkindness"]
    texts = []
    for _ in range(count):
        words = [_choice(g, WORDS + extras) + _choice(g, ["", "", "", ",", ".", "!", "?!", "..."])
                 for _ in range(_index(g, 11))]
        texts.append(_choice(g, [" ", " ", "  ", "\t", "\n"]).join(words))
    return texts


class BertOracle:
    """transformers.BertTokenizerFast built from a vocab.txt, as the notebook builds it."""

    def __init__(self, tokens):
        from transformers import BertTokenizerFast
        self.folder = tempfile.TemporaryDirectory(prefix="bert-vocab-")
        self.path = pathlib.Path(self.folder.name) / "vocab.txt"
        self.path.write_text("\n".join(tokens) + "\n")
        self.vocab = {token: i for i, token in enumerate(self.path.read_text().splitlines())}
        # transformers 5: the argument is `vocab`; `vocab_file=` is silently ignored.
        self.tokenizer = BertTokenizerFast(vocab=str(self.path))
        self.cased = BertTokenizerFast(vocab=str(self.path), do_lower_case=False)

    def __call__(self, texts, cased=False):
        tokenizer = self.cased if cased else self.tokenizer
        encoded = tokenizer(list(texts), padding=True, return_tensors="pt")
        return encoded["input_ids"], encoded["attention_mask"]


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


def _split_without_punctuation(text):
    return text.lower().split()


def _ids_from_words(words_per_text, vocab, left=False, pad_id=None):
    rows = [[vocab[CLS]] + [vocab[p] for w in words for p in reference_wordpiece(w, vocab)] + [vocab[SEP]]
            for words in words_per_text]
    width = max(len(row) for row in rows)
    pad_id = vocab[PAD] if pad_id is None else pad_id
    return torch.tensor([[pad_id] * (width - len(r)) + r if left else r + [pad_id] * (width - len(r)) for r in rows])


def _left_padded(tensor, mask, fill):
    rows = []
    for row, row_mask in zip(tensor.tolist(), mask.tolist()):
        length = sum(row_mask)
        rows.append([fill] * (len(row) - length) + row[:length])
    return torch.tensor(rows)


def ids_diagnoses(oracle, texts, vocab):
    ids, mask = oracle(texts)
    cased_ids, _ = oracle(texts, cased=True)
    zero_padded = ids.masked_fill(mask == 0, 0)
    return {
        "you padded on the left; BERT pads on the right (padding_side='right'), after [SEP].":
            _left_padded(ids, mask, vocab[PAD]),
        "your ids match the text without lower-casing: lower-case it first (the vocabulary is uncased).":
            cased_ids,
        f"padding uses id 0, but in this vocabulary [PAD] is id {vocab[PAD]}: look it up, vocab['[PAD]'].":
            zero_padded if vocab[PAD] != 0 else None,
        "punctuation is still attached to words: split every punctuation character off as a word of its own.":
            _ids_from_words([_split_without_punctuation(t) for t in texts], vocab),
    }


def mask_diagnoses(ids, mask):
    with_specials_masked = mask.clone()
    lengths = mask.sum(dim=1)
    for row, length in enumerate(lengths.tolist()):
        with_specials_masked[row, 0] = 0
        with_specials_masked[row, length - 1] = 0
    return {
        "the mask is inverted: 1 marks a real token (attend to it) and 0 marks padding.": 1 - mask,
        "[CLS] and [SEP] are real tokens: the mask is 1 on them too.": with_specials_masked,
        "your mask has its padding on the left; BERT pads on the right, so the 0s come last.":
            _left_padded(mask, mask, 0),
    }


def _expect_ids(fn, oracle, texts):
    ids, mask = _bert(fn, texts, oracle.vocab)
    expected_ids, _ = oracle(texts)
    B, T = expected_ids.shape
    if tuple(ids.shape) == (B, T - 2):
        raise AssertionError("input_ids is 2 tokens too short: add [CLS] at the start and [SEP] at the end "
                             "of every text, before padding.")
    expect_close(ids, expected_ids, f"input_ids for {texts!r:.120}",
                 "Compare with BertTokenizerFast: lower-case, split on whitespace and punctuation, WordPiece "
                 "each word, add [CLS] ... [SEP], pad with [PAD] on the right.",
                 diagnoses={k: v for k, v in ids_diagnoses(oracle, texts, oracle.vocab).items() if v is not None})


def bert_encode_batch_shapes(fn):
    oracle = BertOracle(shuffled_bert_vocab(1801))
    for seed, count in [(1802, 4), (1803, 1), (1804, 6)]:
        texts = random_texts(seed, count)
        ids, mask = _bert(fn, texts, oracle.vocab)
        expected_ids, _ = oracle(texts)
        B, T = expected_ids.shape
        hint = (f"{B} texts whose longest has {T - 2} tokens give (B, T) = ({B}, {T}): [CLS] + tokens + [SEP], "
                "padded to the longest text in the batch.")
        expect_shape(ids, (B, T), "input_ids", hint)
        expect_shape(mask, (B, T), "attention_mask", hint)
        for name, tensor in (("input_ids", ids), ("attention_mask", mask)):
            if tensor.dtype != torch.long:
                raise AssertionError(f"{name} has dtype {tensor.dtype}; use torch.long (int64), as transformers "
                                     "does: embedding layers index with integer ids, and the mask is 0/1.")


def bert_encode_batch_ids(fn):
    for vocab_seed, text_seed, count in [(1901, 1902, 5), (1903, 1904, 3), (1905, 1906, 8)]:
        oracle = BertOracle(shuffled_bert_vocab(vocab_seed))
        _expect_ids(fn, oracle, random_texts(text_seed, count))
    oracle = BertOracle(shuffled_bert_vocab(1907))
    _expect_ids(fn, oracle, ["", "QUEUE?", "The BAKER's newest, kindest helper (re-)reads 42 recipes..."])


def bert_encode_batch_padding_and_mask(fn):
    oracle = BertOracle(shuffled_bert_vocab(2001))
    batches = [random_texts(2002, 6), ["Only one text, so no padding at all."],
               ["the bread", "the baker", "a loaf"], ["", "Kindness is new.", "x"]]
    for texts in batches:
        ids, mask = _bert(fn, texts, oracle.vocab)
        expected_ids, expected_mask = oracle(texts)
        expect_shape(ids, tuple(expected_ids.shape), "input_ids",
                     "[CLS] + tokens + [SEP], padded to the longest text in the batch.")
        expect_shape(mask, tuple(expected_mask.shape), "attention_mask",
                     "The mask has one entry per token id: shape (B, T), like input_ids.")
        expect_close(mask, expected_mask, f"attention_mask for {texts!r:.120}",
                     "1 for every real token ([CLS] and [SEP] included), 0 for [PAD].",
                     diagnoses=mask_diagnoses(expected_ids, expected_mask))
        pad_id = oracle.vocab[PAD]
        if not bool((ids[expected_mask == 0] == pad_id).all()):
            raise AssertionError(f"padding positions must hold the [PAD] id, vocab['[PAD]'] = {pad_id} here.")
