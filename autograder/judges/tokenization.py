"""Hidden checks for tokenization, the judge side (in the grader only, never mounted in the sandbox): the
oracles, the diagnoses and one judge per probe of autograder/checks/tokenization.py, which also builds the
inputs both sides rebuild from the seeds."""
import json
import math
import pathlib
import tempfile

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tokenizers.models import BPE

from autograder.checks.common import diagnoses_of, expect_close, expect_shape
from autograder.checks.tokenization import (
    CLS,
    END,
    FORMAT_CORPUS,
    INSIDE_WORDS_CASES,
    PAD,
    PRINTABLE_BYTES,
    SEP,
    SHAPE_BATCHES,
    TIE_FREE,
    UNK,
    _describe,
    _merge_everywhere,
    _wordpiece_call,
    ascii_texts,
    bert_encode_batch_ids,
    bert_encode_batch_padding_and_mask,
    bert_encode_batch_shapes,
    bert_vocab,
    bpe_encode_applies_merges_by_priority,
    bpe_encode_known_words,
    bpe_encode_matches_tokenizers,
    byte_level_decode_cut_characters,
    byte_level_decode_round_trip,
    byte_level_pretokenize_unicode,
    byte_level_pretokenize_words_and_spaces,
    bytes_to_unicode_matches_gpt2,
    bytes_to_unicode_printable_bijection,
    continuation_cases,
    course_byte_bpe,
    cut_cases,
    greedy_cases,
    greedy_split,
    id_cases,
    known_words_case,
    longest_match_cases,
    oracle_encode,
    padding_batches,
    pair_counts,
    priority_cases,
    random_texts,
    reference_bytes_to_unicode,
    reference_merges,
    reference_wordpiece,
    round_trip_cases,
    seeded_corpus,
    shuffled_bert_vocab,
    stretch_unigram_segment_beats_greedy,
    stretch_unigram_segment_matches_tokenizers,
    tie_cases,
    tie_free_corpus,
    train_bpe_breaks_ties_lexicographically,
    train_bpe_format,
    train_bpe_matches_tokenizers,
    train_bpe_stays_inside_words,
    unicode_texts,
    unigram_match_cases,
    unknown_word_cases,
    unseen_words_case,
    word_counts,
    wordpiece_continuation_prefix,
    wordpiece_longest_match_first,
    wordpiece_oracle,
    wordpiece_unknown_words,
)


# ---------------------------------------------------------------- comparing tokens and merges (judge)
def expect_tokens(actual, expected, what, hint="", diagnoses=None):
    """Like common.expect_close, for lists of tokens (`diagnoses`: see common.diagnoses_of)."""
    if actual == list(expected):
        return
    for misconception, wrong in diagnoses_of(diagnoses).items():
        if actual == list(wrong):
            raise AssertionError(f"{what} returned {actual}, expected {list(expected)}: {misconception}")
    raise AssertionError(f"{what} returned {actual}, expected {list(expected)}. {hint}".strip())


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


@train_bpe_format.judge
def judge_train_bpe_format(seeds, data):
    merges = data["merges"]
    if len(merges) != 7:
        raise AssertionError(f"train_bpe(corpus, 7) returned {len(merges)} merges: return exactly num_merges "
                             "merges while pairs are left.")
    counts = word_counts(seeded_corpus(seeds, *FORMAT_CORPUS))
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
    if data["no_merges"] != "[]":
        raise AssertionError("train_bpe(corpus, 0) should return [] (no merges).")


@train_bpe_matches_tokenizers.judge
def judge_train_bpe_matches_tokenizers(seeds, results):
    for case, merges in zip(TIE_FREE, results, strict=True):
        corpus = tie_free_corpus(seeds.token, *case)
        expect_merges(merges, trainer_merges(corpus, case[-1]), corpus, _describe(corpus))


@train_bpe_breaks_ties_lexicographically.judge
def judge_train_bpe_breaks_ties_lexicographically(seeds, results):
    for (corpus, num_merges), merges in zip(tie_cases(seeds), results, strict=True):
        expect_merges(merges, reference_merges(corpus, num_merges), corpus, _describe(corpus))


@train_bpe_stays_inside_words.judge
def judge_train_bpe_stays_inside_words(seeds, results):
    for (corpus, num_merges), merges in zip(INSIDE_WORDS_CASES, results, strict=True):
        expect_merges(merges, reference_merges(corpus, num_merges), corpus, _describe(corpus))


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


def expect_encoding(tokens, word, merges, expected):
    what = f"bpe_encode({word!r}, merges)"
    diagnoses = encode_diagnoses(word, merges)
    if "".join(tokens) != word + END and tokens not in diagnoses.values():
        raise AssertionError(f"{what} returned {tokens}; joined together, the tokens "
                             f"must spell the word followed by '</w>' ({word + END!r}).")
    expect_tokens(tokens, expected, what, "tokenizers' BPE model (end_of_word_suffix='</w>') splits it that way.",
                  diagnoses=diagnoses)


@bpe_encode_known_words.judge
def judge_bpe_encode_known_words(seeds, results):
    words, merges = known_words_case(seeds)
    expected = oracle_encode(words, merges)
    for word, tokens in zip(words, results, strict=True):
        expect_encoding(tokens, word, merges, expected[word])


@bpe_encode_matches_tokenizers.judge
def judge_bpe_encode_matches_tokenizers(seeds, results):
    words, merges = unseen_words_case(seeds)
    expected = oracle_encode(words, merges)
    for word, tokens in zip(words, results, strict=True):
        expect_encoding(tokens, word, merges, expected[word])


@bpe_encode_applies_merges_by_priority.judge
def judge_bpe_encode_applies_merges_by_priority(seeds, results):
    for (word, merges), tokens in zip(priority_cases(), results, strict=True):
        expect_encoding(tokens, word, merges, oracle_encode([word], merges)[word])


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


def expect_wordpieces(cases, results):
    """Judge side: each case's pieces against tokenizers' WordPiece, naming the misconception."""
    for (word, vocab, unk_token), pieces in zip(cases, results, strict=True):
        unk = UNK if unk_token is None else unk_token
        expect_tokens(pieces, wordpiece_oracle(word, vocab, unk), _wordpiece_call(word, unk_token),
                      "tokenizers' WordPiece splits it that way: at each position take the longest piece in "
                      "the vocabulary ('##' + piece after the first).",
                      diagnoses={k: v for k, v in wordpiece_diagnoses(word, vocab, unk).items() if v is not None})


@wordpiece_continuation_prefix.judge
def judge_wordpiece_continuation_prefix(seeds, results):
    expect_wordpieces(continuation_cases(seeds), results)


@wordpiece_longest_match_first.judge
def judge_wordpiece_longest_match_first(seeds, results):
    expect_wordpieces(longest_match_cases(seeds), results)


@wordpiece_unknown_words.judge
def judge_wordpiece_unknown_words(seeds, results):
    expect_wordpieces(unknown_word_cases(seeds), results)


class BertOracle:
    """transformers.BertTokenizerFast built from a vocab.txt, as the notebook builds it (judge side)."""

    def __init__(self, tokens):
        from transformers import BertTokenizerFast
        self.folder = tempfile.TemporaryDirectory(prefix="bert-vocab-")
        self.path = pathlib.Path(self.folder.name) / "vocab.txt"
        self.path.write_text("\n".join(tokens) + "\n")
        self.vocab = {token: i for i, token in enumerate(self.path.read_text().splitlines())}
        if self.vocab != bert_vocab(tokens):
            raise RuntimeError("the vocab.txt written for the oracle does not read back as the probe's vocab")
        # transformers 5: the argument is `vocab`; `vocab_file=` is silently ignored.
        self.tokenizer = BertTokenizerFast(vocab=str(self.path))
        self.cased = BertTokenizerFast(vocab=str(self.path), do_lower_case=False)

    def __call__(self, texts, cased=False):
        tokenizer = self.cased if cased else self.tokenizer
        encoded = tokenizer(list(texts), padding=True, return_tensors="pt")
        return encoded["input_ids"], encoded["attention_mask"]


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


def expect_ids(ids, oracle, texts):
    expected_ids, _ = oracle(texts)
    B, T = expected_ids.shape
    if tuple(ids.shape) == (B, T - 2):
        raise AssertionError("input_ids is 2 tokens too short: add [CLS] at the start and [SEP] at the end "
                             "of every text, before padding.")
    expect_close(ids, expected_ids, f"input_ids for {texts!r:.120}",
                 "Compare with BertTokenizerFast: lower-case, split on whitespace and punctuation, WordPiece "
                 "each word, add [CLS] ... [SEP], pad with [PAD] on the right.",
                 diagnoses={k: v for k, v in ids_diagnoses(oracle, texts, oracle.vocab).items() if v is not None})


@bert_encode_batch_shapes.judge
def judge_bert_encode_batch_shapes(seeds, results):
    oracle = BertOracle(shuffled_bert_vocab(seeds.generator(1801)))
    for (stream, count), (ids, mask) in zip(SHAPE_BATCHES, results, strict=True):
        expected_ids, _ = oracle(random_texts(seeds.generator(stream), count))
        B, T = expected_ids.shape
        hint = (f"{B} texts whose longest has {T - 2} tokens give (B, T) = ({B}, {T}): [CLS] + tokens + [SEP], "
                "padded to the longest text in the batch.")
        expect_shape(ids, (B, T), "input_ids", hint)
        expect_shape(mask, (B, T), "attention_mask", hint)
        for name, tensor in (("input_ids", ids), ("attention_mask", mask)):
            if tensor.dtype != torch.long:
                raise AssertionError(f"{name} has dtype {tensor.dtype}; use torch.long (int64), as transformers "
                                     "does: embedding layers index with integer ids, and the mask is 0/1.")


@bert_encode_batch_ids.judge
def judge_bert_encode_batch_ids(seeds, results):
    for (tokens, texts), ids in zip(id_cases(seeds), results, strict=True):
        expect_ids(ids, BertOracle(tokens), texts)


@bert_encode_batch_padding_and_mask.judge
def judge_bert_encode_batch_padding_and_mask(seeds, results):
    oracle = BertOracle(shuffled_bert_vocab(seeds.generator(2001)))
    for texts, (ids, mask) in zip(padding_batches(seeds), results, strict=True):
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


# ---------------------------------------------------------------- exercises 4-6: byte-level BPE (GPT-2)
# The oracles: transformers' copy of GPT-2's `bytes_to_unicode` for the table (imported when first
# needed), tokenizers' `pre_tokenizers.ByteLevel(add_prefix_space=False)` for the pre-tokenizer, and
# for decoding `decoders.ByteLevel` and the course's own byte-level BPE (ByteLevel pre-tokenizer + BPE
# model + ByteLevel decoder, trained on the course's stories: courselib/data/tiny_gpt/tokenizer.json).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def reference_pretokenize(text, pattern=GPT2_PATTERN, table=None):
    import regex
    table = table or reference_bytes_to_unicode()
    return ["".join(table[b] for b in piece.encode("utf-8")) for piece in regex.findall(pattern, text)]


def reference_decode(tokens, errors="replace"):
    inverse = {char: b for b, char in reference_bytes_to_unicode().items()}
    return bytes(inverse[char] for char in "".join(tokens)).decode("utf-8", errors=errors)


def gpt2_table():
    """Judge side: transformers' copy of GPT-2's bytes_to_unicode."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    return bytes_to_unicode()


@bytes_to_unicode_printable_bijection.judge
def judge_bytes_to_unicode_printable_bijection(seeds, pairs):
    keys = [key for key, _ in pairs]
    if not all(type(key) is int for key in keys):
        wrong = next(key for key in keys if type(key) is not int)
        raise AssertionError(f"bytes_to_unicode()'s keys should be the byte values, the ints 0 to 255; one is {wrong}.")
    if sorted(keys) != list(range(256)):
        missing = sorted(set(range(256)) - set(keys))
        raise AssertionError(f"bytes_to_unicode() has {len(set(keys))} keys: it needs all 256 byte values 0..255 "
                             f"(missing: {missing[:8]}{'...' if len(missing) > 8 else ''}), so that any byte, "
                             "and so any text, can be written.")
    table = dict(pairs)
    for byte, char in sorted(table.items()):
        if len(char) != 1:
            raise AssertionError(f"bytes_to_unicode()[{byte}] is {char!r}: every byte stands for one character.")
    for byte, char in sorted(table.items()):
        if not char.isprintable() or char.isspace():
            raise AssertionError(
                f"bytes_to_unicode()[{byte}] is {char!r}, a whitespace or control character. GPT-2 gives such bytes "
                "visible stand-ins, chr(256 + n), so that every token is a visible string without spaces: the space "
                "(byte 32) becomes 'Ġ'.")
    seen = {}
    for byte, char in sorted(table.items()):
        if char in seen:
            raise AssertionError(f"bytes {seen[char]} and {byte} both map to {char!r}: the table must be one-to-one, "
                                 "or decoding can't tell them apart.")
        seen[char] = byte


def with_soft_hyphen_kept():
    printable = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 255]
    moved = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + n) for n, b in enumerate(moved)}}


def table_diagnoses():
    moved = [b for b in range(256) if b not in PRINTABLE_BYTES]
    kept = {b: chr(b) for b in PRINTABLE_BYTES}
    return {
        "the n-th moved byte (n = 0, 1, 2, ... counting only the 68 bytes that are not printable, in increasing "
        "order) maps to chr(256 + n), not chr(256 + byte).": {**kept, **{b: chr(256 + b) for b in moved}},
        "byte 173, the soft hyphen, is invisible: it is not among the printable bytes and moves too "
        "(the printable ranges are 33-126, 161-172 and 174-255).": with_soft_hyphen_kept(),
    }


@bytes_to_unicode_matches_gpt2.judge
def judge_bytes_to_unicode_matches_gpt2(seeds, pairs):
    table, expected = dict(pairs), gpt2_table()
    if table == expected:
        return
    for misconception, wrong in table_diagnoses().items():
        if table == wrong:
            raise AssertionError(f"bytes_to_unicode() is not GPT-2's table: {misconception}")
    byte = next(b for b in range(256) if table.get(b) != expected[b])
    raise AssertionError(
        f"bytes_to_unicode()[{byte}] is {table.get(byte)!r}, GPT-2's table has {expected[byte]!r}. The printable bytes "
        "(33-126, 161-172, 174-255) keep their own character chr(byte); the other 68, in increasing order, become "
        "chr(256), chr(257), ...")


def pretokenize_diagnoses(text):
    table = reference_bytes_to_unicode()
    import regex
    return {
        "the space belongs to the word after it ('Ġworld'): GPT-2's pattern has an optional space ' ?' in "
        "front of letters, numbers and other symbols.":
            reference_pretokenize(text, GPT2_PATTERN.replace(" ?", "")),
        "runs of spaces, tabs and newlines must survive (text.split() loses them): use GPT-2's pattern on the "
        "text itself.": reference_pretokenize(" ".join(text.split())),
        "map the UTF-8 bytes of each piece (piece.encode('utf-8')), not its characters: 'é' is two bytes, "
        "shown 'Ã©'.": ["".join(table.get(ord(c), c) for c in piece) for piece in regex.findall(GPT2_PATTERN, text)],
        "every byte must go through bytes_to_unicode(): the space becomes 'Ġ', the newline 'Ċ'.":
            regex.findall(GPT2_PATTERN, text),
    }


def expect_pieces(texts, results):
    oracle = pre_tokenizers.ByteLevel(add_prefix_space=False)
    for text, pieces in zip(texts, results, strict=True):
        expected = [piece for piece, _ in oracle.pre_tokenize_str(text)]
        expect_tokens(pieces, expected, f"byte_level_pretokenize({text!r})",
                      "tokenizers' ByteLevel pre-tokenizer gives that: split with GPT-2's pattern (regex.findall), "
                      "then map every UTF-8 byte of each piece through bytes_to_unicode().",
                      diagnoses=lambda: pretokenize_diagnoses(text))


@byte_level_pretokenize_words_and_spaces.judge
def judge_byte_level_pretokenize_words_and_spaces(seeds, results):
    expect_pieces(ascii_texts(seeds), results)


@byte_level_pretokenize_unicode.judge
def judge_byte_level_pretokenize_unicode(seeds, results):
    expect_pieces(unicode_texts(seeds), results)


def decode_diagnoses(tokens):
    inverse = {char: b for b, char in reference_bytes_to_unicode().items()}
    return {
        "decode all the bytes together as UTF-8, not token by token: a character's bytes can be spread over "
        "several tokens (an emoji is 4 bytes).": "".join(reference_decode([token]) for token in tokens),
        "decode the bytes as UTF-8 (bytes(...).decode('utf-8')): chr() of each byte, or latin-1, turns 'é' "
        "into 'Ã©'.": "".join(chr(inverse[c]) for c in "".join(tokens)),
        "bytes that are not valid UTF-8 become '\ufffd' (errors='replace'), not nothing (errors='ignore').":
            reference_decode(tokens, errors="ignore"),
        "every character of a token stands for a byte, not just 'Ġ' for the space: map each one back with the "
        "inverse of bytes_to_unicode().": "".join(tokens).replace("Ġ", " ").replace("Ċ", "\n"),
    }


def expect_decoded(cases, results, expected_texts):
    for tokens, text, expected in zip(cases, results, expected_texts, strict=True):
        if text == expected:
            continue
        for misconception, wrong in decode_diagnoses(tokens).items():
            if text == wrong and wrong != expected:
                raise AssertionError(f"byte_level_decode({tokens!r:.120}) returned {text!r:.80}, expected "
                                     f"{expected!r:.80}: {misconception}")
        raise AssertionError(f"byte_level_decode({tokens!r:.120}) returned {text!r:.80}, expected {expected!r:.80}. "
                             "Join the tokens, map each character back to its byte, and decode the bytes as UTF-8 "
                             "with errors='replace'.")


@byte_level_decode_round_trip.judge
def judge_byte_level_decode_round_trip(seeds, results):
    cases = round_trip_cases(seeds)
    bpe, decoder = course_byte_bpe(), decoders.ByteLevel()
    expected = [decoder.decode(tokens) if kind != "BPE" else bpe.decode([bpe.token_to_id(t) for t in tokens])
                for tokens, kind in cases]
    expect_decoded([tokens for tokens, _ in cases], results, expected)


@byte_level_decode_cut_characters.judge
def judge_byte_level_decode_cut_characters(seeds, results):
    cases = cut_cases(seeds)
    decoder = decoders.ByteLevel()
    expect_decoded(cases, results, [decoder.decode(tokens) for tokens in cases])


# ---------------------------------------------------------------- exercise 8 (optional stretch): unigram_segment
# The oracle is tokenizers' Unigram model: `Model.tokenize` runs its Viterbi search on the word alone
# (no normaliser, no pre-tokenizer). It needs an unknown token, which it also offers, scored below the
# vocabulary's lowest score (by 10 in tokenizers' source), wherever no piece of one character starts.
# With the unknown token's own score at -1000, that detour is far below any split into known pieces
# here (at most 16 pieces, each of log-probability above -20: -13.4 at worst over 300 seeds), so
# wherever a split exists the oracle returns it; the judge still makes sure no unknown token came back.
UNIGRAM_UNK, UNIGRAM_UNK_SCORE = "<unk>", -1000.0


def _best_split(word, log_probs, gain):
    """Viterbi with best[end] = max over start of gain(best[start], log p(word[start:end])): the
    judge's model of the wrong objectives (None where no split exists)."""
    best, back = [0.0] + [None] * len(word), [0] * (len(word) + 1)
    for end in range(1, len(word) + 1):
        for start in range(end):
            piece = word[start:end]
            if best[start] is not None and piece in log_probs:
                score = gain(best[start], log_probs[piece])
                if best[end] is None or score > best[end]:
                    best[end], back[end] = score, start
    if best[-1] is None:
        return None
    pieces, end = [], len(word)
    while end > 0:
        pieces.append(word[back[end]:end])
        end = back[end]
    return pieces[::-1]


def unigram_diagnoses(word, log_probs, expected):
    """What a buggy unigram_segment returns, keyed by the misconception (None where it does not apply)."""
    return {
        "that is greedy longest-match (WordPiece's rule): the longest first piece can be rare and leave rare "
        "pieces after it. Compare the totals of all splits: best[i] = max over j of best[j] + log p(word[j:i]).":
            greedy_split(word, log_probs),
        "your split is chosen by the log-probability of its last piece alone: add the best total of what comes "
        "before it, best[j] + log p(word[j:i]).": _best_split(word, log_probs, lambda before, piece: piece),
        "you added probabilities, exp(log p), instead of log-probabilities: the probability of a split is the "
        "product of its pieces' probabilities, so add their logs.":
            _best_split(word, log_probs, lambda before, piece: before + math.exp(piece)),
        "the first piece is missing: backtrack until position 0, the start of the word.":
            expected[1:] if len(expected) > 1 else None,
        "your pieces are in reverse order: backtracking collects them from the end of the word, so reverse them.":
            expected[::-1] if expected[::-1] != expected else None,
    }


def unigram_oracle(log_probs):
    """Judge side: tokenizers' Unigram model with these pieces and an unknown token out of the way."""
    model = models.Unigram([(UNIGRAM_UNK, UNIGRAM_UNK_SCORE), *log_probs.items()], unk_id=0)

    def segment(word):
        tokens = model.tokenize(word)
        if any(token.id == 0 for token in tokens):
            raise RuntimeError(f"tokenizers' Unigram put {UNIGRAM_UNK} into {word!r}: the check's inputs need "
                               "another design")
        return [token.value for token in tokens]
    return segment


def _describe_vocab(log_probs, width=150):
    shown = []
    for piece, score in log_probs.items():
        if sum(len(s) + 2 for s in shown) > width:
            shown.append("...")
            break
        shown.append(f"{piece!r}: {score:.2f}")
    return "{" + ", ".join(shown) + "}"


def expect_split(word, log_probs, outcome, expected):
    """Judge side: the student's outcome for a word that has a split, against the oracle's pieces."""
    what = f"unigram_segment({word!r}, log_probs={_describe_vocab(log_probs)})"
    if "raised" in outcome:
        raise AssertionError(f"{what} raised {outcome['raised']}: {outcome['message']}, but the word has a split: "
                             f"{expected}. Consider every split (dynamic programming), not only the longest piece first.")
    pieces = outcome["pieces"]
    if pieces == expected:
        return
    total = f"total log-probability {sum(log_probs[p] for p in expected):.3f}"
    for misconception, wrong in unigram_diagnoses(word, log_probs, expected).items():
        if wrong is not None and pieces == wrong and wrong != expected:
            raise AssertionError(f"{what} returned {pieces}, expected {expected} ({total}): {misconception}")
    if "".join(pieces) != word or not all(p in log_probs for p in pieces):
        raise AssertionError(f"{what} returned {pieces}, expected {expected}: the pieces must be keys of log_probs "
                             "and spell the word when joined.")
    raise AssertionError(f"{what} returned {pieces} (total log-probability {sum(log_probs[p] for p in pieces):.3f}), "
                         f"expected {expected} ({total}), the split that tokenizers' Unigram model finds. "
                         "best[i] = max over j < i of best[j] + log p(word[j:i]), then backtrack from the end.")


def expect_no_split(word, log_probs, outcome):
    what = f"unigram_segment({word!r}, log_probs={_describe_vocab(log_probs)})"
    if "pieces" in outcome:
        raise AssertionError(f"{what} returned {outcome['pieces']}, but no pieces of log_probs spell {word!r}: "
                             "raise ValueError with the word in its message.")
    if not outcome["value_error"]:
        raise AssertionError(f"{what} raised {outcome['raised']}: {outcome['message']}. When no split exists, raise "
                             f"ValueError (with the word in its message), not {outcome['raised']}.")
    if word not in outcome["message"]:
        raise AssertionError(f"{what} raised ValueError({outcome['message']!r}): name the word in the message, "
                             f"e.g. ValueError(f'no split of {{word!r}}').")


@stretch_unigram_segment_matches_tokenizers.judge
def judge_stretch_unigram_segment_matches_tokenizers(seeds, outcomes):
    cases = unigram_match_cases(seeds)
    oracles = {}
    for (word, log_probs), outcome in zip(cases, outcomes, strict=True):
        key = id(log_probs)  # one model per vocabulary
        oracle = oracles.setdefault(key, unigram_oracle(log_probs))
        expect_split(word, log_probs, outcome, oracle(word))


@stretch_unigram_segment_beats_greedy.judge
def judge_stretch_unigram_segment_beats_greedy(seeds, outcomes):
    for (word, log_probs, splits), outcome in zip(greedy_cases(seeds), outcomes, strict=True):
        if splits:
            expect_split(word, log_probs, outcome, unigram_oracle(log_probs)(word))
        else:
            expect_no_split(word, log_probs, outcome)
