"""Mutants and alternative correct answers for 01_tokenization."""
from autograder.tests.variants import WARN_AND_PRINT, Variant

ASSIGNMENT = "01_tokenization"
TRAIN = "train_bpe_answer"
ENCODE = "bpe_encode_answer"
WORDPIECE = "wordpiece_tokenize_answer"
BERT = "bert_encode_batch_answer"
TABLE = "bytes_to_unicode_answer"
PRETOKENIZE = "byte_level_pretokenize_answer"
DECODE = "byte_level_decode_answer"
UNIGRAM = "unigram_segment_answer"
UNIGRAM_VALUES = "stretch_unigram_segment_matches_tokenizers"
UNIGRAM_GREEDY = "stretch_unigram_segment_beats_greedy"


def train(body):
    return "def train_bpe(corpus, num_merges):\n" + body


# a correct bpe_encode: replay the merges in the order they were learned
ENCODE_BY_REPLAYING_MERGES = """
    symbols = [*word[:-1], word[-1] + "</w>"]
    for left, right in merges:
        i = 0
        while i < len(symbols) - 1:
            if symbols[i] == left and symbols[i + 1] == right:
                symbols[i:i + 2] = [left + right]
            i += 1
    return symbols
"""


def encode(body):
    return "def bpe_encode(word, merges):\n" + body


def wordpiece(body):
    return 'def wordpiece_tokenize(word, vocab, unk_token="[UNK]"):\n' + body


def bert(body):
    return "def bert_encode_batch(texts, vocab):\n" + body


def table(body):
    return "def bytes_to_unicode():\n" + body


def pretokenize(body):
    return "def byte_level_pretokenize(text):\n" + body


def decode(body):
    return "def byte_level_decode(tokens):\n" + body


def unigram(body):
    return "def unigram_segment(word, log_probs):\n" + body


def unigram_viterbi(score="best[start] + log_probs[piece]", walk_back="while end > 0:", result="pieces[::-1]",
                    no_split='raise ValueError(f"no split of {word!r}")'):
    """The reference's dynamic programme with one part swapped for a bug."""
    return unigram(f"""
    n = len(word)
    best = [0.0] + [-math.inf] * n
    back = [0] * (n + 1)
    for end in range(1, n + 1):
        for start in range(end):
            piece = word[start:end]
            if piece in log_probs and best[start] > -math.inf and {score} > best[end]:
                best[end] = {score}
                back[end] = start
    if best[n] == -math.inf:
        {no_split}
    pieces, end = [], n
    {walk_back}
        pieces.append(word[back[end]:end])
        end = back[end]
    return {result}
""")


# ---- building blocks of the byte-level exercises, recombined with one bug each
def table_from(printable):
    return table(f"""
    printable = {printable}
    moved = [b for b in range(256) if b not in printable]
    return {{**{{b: chr(b) for b in printable}}, **{{b: chr(256 + n) for n, b in enumerate(moved)}}}}
""")


GPT2_PRINTABLE = '[*range(33, 127), *range(161, 173), *range(174, 256)]'


def pretokenize_with(pieces="regex.findall(GPT2_PATTERN, text)", byte_chars="table[b] for b in piece.encode('utf-8')"):
    return pretokenize(f"""
    table = bytes_to_unicode()
    return ["".join({byte_chars}) for piece in {pieces}]
""")


def decode_with(decoding='data.decode("utf-8", errors="replace")'):
    return decode(f"""
    byte_of = {{char: b for b, char in bytes_to_unicode().items()}}
    data = bytes(byte_of[char] for char in "".join(tokens))
    return {decoding}
""")


# ---- building blocks of a correct train_bpe, recombined with one bug each
def train_loop(count_pairs, choose, start="list(word[:-1]) + [word[-1] + '</w>']"):
    return train(f"""
    word_counts = Counter(word for text in corpus for word in text.split())
    splits = {{word: {start} for word in word_counts}}
    merges = []
    for _ in range(num_merges):
        pairs = Counter()
{count_pairs}
        if not pairs:
            break
        best = {choose}
        merges.append(best)
        for word, symbols in splits.items():
            merged, i = [], 0
            while i < len(symbols):
                if tuple(symbols[i:i + 2]) == best:
                    merged.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            splits[word] = merged
    return merges
""")


WEIGHTED = """        for word, count in word_counts.items():
            for pair in zip(splits[word], splits[word][1:]):
                pairs[pair] += count"""
SMALLEST = "min(pairs, key=lambda pair: (-pairs[pair], pair))"

# ---- the same for bert_encode_batch
SPLIT_WORDS = """
def split_words(text):
    words = []
    for chunk in text.lower().split():
        current = ""
        for ch in chunk:
            if ch in string.punctuation:
                words += [current, ch] if current else [ch]
                current = ""
            else:
                current += ch
        if current:
            words.append(current)
    return words
"""


def bert_pipeline(split="split_words(text)", pad="right", pad_id='vocab["[PAD]"]', mask_value=1,
                  cls_sep=True, mask_dtype="torch.long", mask_specials=True):
    wrap = '["[CLS]"] + pieces + ["[SEP]"]' if cls_sep else "pieces"
    fill_mask = "mask[b, :len(ids)]" if pad == "right" else "mask[b, T - len(ids):]"
    fill_ids = "input_ids[b, :len(ids)]" if pad == "right" else "input_ids[b, T - len(ids):]"
    specials = "" if mask_specials else """
        mask[b, 0] = 1 - mask_value
        mask[b, len(ids) - 1] = 1 - mask_value"""
    return SPLIT_WORDS + bert(f"""
    rows = []
    for text in texts:
        pieces = [p for w in {split} for p in wordpiece_tokenize(w, vocab)]
        rows.append([vocab[t] for t in {wrap}])
    T = max(len(ids) for ids in rows)
    mask_value = {mask_value}
    input_ids = torch.full((len(rows), T), {pad_id}, dtype=torch.long)
    mask = torch.full((len(rows), T), 1 - mask_value, dtype={mask_dtype})
    for b, ids in enumerate(rows):
        {fill_ids} = torch.tensor(ids)
        {fill_mask} = mask_value{specials}
    return {{"input_ids": input_ids, "attention_mask": mask}}
""")


MUTANTS = [
    # ---- train_bpe
    Variant("bpe_counts_pairs_across_word_boundaries", {TRAIN: train("""
    # every line as one long sequence of symbols: pairs span the space between words
    lines = [[s for word in text.split() for s in list(word[:-1]) + [word[-1] + '</w>']] for text in corpus]
    merges = []
    for _ in range(num_merges):
        pairs = Counter(pair for symbols in lines for pair in zip(symbols, symbols[1:]))
        if not pairs:
            break
        best = min(pairs, key=lambda pair: (-pairs[pair], pair))
        merges.append(best)
        new_lines = []
        for symbols in lines:
            merged, i = [], 0
            while i < len(symbols):
                if tuple(symbols[i:i + 2]) == best:
                    merged.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            new_lines.append(merged)
        lines = new_lines
    return merges
""")}, loses=("train_bpe_stays_inside_words", "train_bpe_matches_tokenizers"), message="word boundary"),
    Variant("bpe_breaks_ties_by_largest_pair", {TRAIN: train_loop(WEIGHTED, "max(pairs, key=lambda pair: (pairs[pair], pair))")},
            loses=("train_bpe_breaks_ties_lexicographically", "train_bpe_format"), message="take the smallest"),
    Variant("bpe_breaks_ties_by_first_seen", {TRAIN: train_loop(WEIGHTED, "pairs.most_common(1)[0][0]")},
            loses=("train_bpe_breaks_ties_lexicographically", "train_bpe_matches_tokenizers"), message="tie"),
    Variant("bpe_counts_each_distinct_word_once", {TRAIN: train_loop("""        for word in word_counts:
            for pair in zip(splits[word], splits[word][1:]):
                pairs[pair] += 1""", SMALLEST)},
            loses=("train_bpe_matches_tokenizers",), message="how often the word appears"),
    Variant("bpe_end_of_word_as_separate_symbol", {TRAIN: train_loop(WEIGHTED, SMALLEST, start="list(word) + ['</w>']")},
            loses=("train_bpe_format", "train_bpe_matches_tokenizers"), message="glued to the last character"),
    Variant("bpe_forgets_to_apply_merges", {TRAIN: train("""
    word_counts = Counter(word for text in corpus for word in text.split())
    pairs = Counter()
    for word, count in word_counts.items():
        symbols = list(word[:-1]) + [word[-1] + '</w>']
        for pair in zip(symbols, symbols[1:]):
            pairs[pair] += count
    # counts once, then takes the top pairs: never merges anything
    return sorted(pairs, key=lambda pair: (-pairs[pair], pair))[:num_merges]
""")}, loses=("train_bpe_matches_tokenizers", "train_bpe_breaks_ties_lexicographically"),
            message="apply every merge to every word"),
    # Hard-coding the visible toy answer earns nothing: the hidden corpora are different.
    Variant("bpe_hard_coded_toy_merges", {TRAIN: train("""
    toy = [("e", "s"), ("es", "t</w>"), ("l", "o"), ("e", "w"), ("ew", "est</w>"), ("n", "ewest</w>"),
           ("lo", "w</w>"), ("d", "est</w>"), ("i", "dest</w>"), ("w", "idest</w>"), ("e", "r</w>"), ("lo", "w")]
    if corpus == ["cd ab cd ab"]:
        return [("a", "b</w>"), ("c", "d</w>")]
    if corpus == ["a b a b a b"]:
        return []
    return toy[:num_merges]
""")}, loses=("train_bpe_format", "train_bpe_matches_tokenizers", "train_bpe_breaks_ties_lexicographically",
              "train_bpe_stays_inside_words"), message="neither a starting symbol"),
    # ---- bpe_encode
    Variant("encode_merges_first_known_pair_from_the_left", {ENCODE: encode("""
    symbols = list(word[:-1]) + [word[-1] + "</w>"]
    known = set(merges)
    merged = True
    while merged:
        merged = False
        for i in range(len(symbols) - 1):
            if (symbols[i], symbols[i + 1]) in known:
                symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]
                merged = True
                break
    return symbols
""")}, loses=("bpe_encode_applies_merges_by_priority",), message="priority"),
    Variant("encode_without_end_of_word_marker", {ENCODE: encode("""
    symbols = list(word)
    for pair in merges:
        i = 0
        while i < len(symbols) - 1:
            if (symbols[i], symbols[i + 1]) == pair:
                symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]
            i += 1
    return symbols
""")}, loses=("bpe_encode_known_words", "bpe_encode_matches_tokenizers"), message="end-of-word marker"),
    Variant("encode_each_merge_once", {ENCODE: encode("""
    symbols = list(word[:-1]) + [word[-1] + "</w>"]
    for pair in merges:
        for i in range(len(symbols) - 1):
            if (symbols[i], symbols[i + 1]) == pair:
                symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]
                break
    return symbols
""")}, loses=("bpe_encode_applies_merges_by_priority",), message="every occurrence"),
    Variant("encode_string_replace", {ENCODE: encode("""
    # the classic bug: replacing 'a b' in a space-joined string also matches inside longer symbols
    text = " ".join(list(word[:-1]) + [word[-1] + "</w>"])
    for left, right in merges:
        text = text.replace(left + " " + right, left + right)
    return text.split(" ")
""")}, loses=("bpe_encode_matches_tokenizers",), message="tokenizers' BPE model"),
    # ---- wordpiece_tokenize
    Variant("wordpiece_shortest_match", {WORDPIECE: wordpiece("""
    pieces, start = [], 0
    while start < len(word):
        for end in range(start + 1, len(word) + 1):
            piece = word[start:end] if start == 0 else "##" + word[start:end]
            if piece in vocab:
                break
        else:
            return [unk_token]
        pieces.append(piece)
        start = end
    return pieces
""")}, loses=("wordpiece_longest_match_first", "wordpiece_continuation_prefix"), message="takes the longest"),
    Variant("wordpiece_forgets_hashes", {WORDPIECE: wordpiece("""
    pieces, start = [], 0
    while start < len(word):
        for end in range(len(word), start, -1):
            if word[start:end] in vocab:
                break
        else:
            return [unk_token]
        pieces.append(word[start:end])
        start = end
    return pieces
""")}, loses=("wordpiece_continuation_prefix", "wordpiece_longest_match_first"), message="'##' prefix"),
    Variant("wordpiece_unk_only_for_the_rest", {WORDPIECE: wordpiece("""
    pieces, start = [], 0
    while start < len(word):
        for end in range(len(word), start, -1):
            piece = word[start:end] if start == 0 else "##" + word[start:end]
            if piece in vocab:
                break
        else:
            return pieces + [unk_token]
        pieces.append(piece)
        start = end
    return pieces
""")}, loses=("wordpiece_unknown_words",), message="whole word"),
    Variant("wordpiece_ignores_unk_token_argument", {WORDPIECE: wordpiece("""
    pieces, start = [], 0
    while start < len(word):
        for end in range(len(word), start, -1):
            piece = word[start:end] if start == 0 else "##" + word[start:end]
            if piece in vocab:
                break
        else:
            return ["[UNK]"]
        pieces.append(piece)
        start = end
    return pieces
""")}, loses=("wordpiece_unknown_words",), message="unk_token"),
    Variant("wordpiece_backtracks", {WORDPIECE: wordpiece("""
    def search(start):
        if start == len(word):
            return []
        for end in range(len(word), start, -1):
            piece = word[start:end] if start == 0 else "##" + word[start:end]
            if piece in vocab:
                rest = search(end)
                if rest is not None:
                    return [piece] + rest
        return None
    pieces = search(0)
    return [unk_token] if pieces is None else pieces
""")}, loses=("wordpiece_unknown_words",), message="never goes back"),
    # ---- bert_encode_batch
    Variant("bert_pads_on_the_left", {BERT: bert_pipeline(pad="left")},
            loses=("bert_encode_batch_ids", "bert_encode_batch_padding_and_mask"), message="pad on the right"),
    Variant("bert_mask_inverted", {BERT: bert_pipeline(mask_value=0)},
            loses=("bert_encode_batch_padding_and_mask",), message="inverted"),
    Variant("bert_no_lower_casing", {BERT: bert_pipeline().replace("text.lower().split()", "text.split()")},
            loses=("bert_encode_batch_ids",), message="lower-case"),
    Variant("bert_punctuation_left_attached", {BERT: bert_pipeline(split="text.lower().split()")},
            loses=("bert_encode_batch_ids",), message="punctuation"),
    Variant("bert_pads_with_id_zero", {BERT: bert_pipeline(pad_id="0")},
            loses=("bert_encode_batch_ids",), message="vocab['[PAD]']"),
    Variant("bert_without_cls_and_sep", {BERT: bert_pipeline(cls_sep=False)},
            loses=("bert_encode_batch_shapes", "bert_encode_batch_ids"), message="[CLS]"),
    Variant("bert_masks_out_cls_and_sep", {BERT: bert_pipeline(mask_specials=False)},
            loses=("bert_encode_batch_padding_and_mask",), message="[CLS] and [SEP] as real tokens"),
    Variant("bert_boolean_mask", {BERT: bert_pipeline(mask_value="True", mask_dtype="torch.bool")
                                  .replace("1 - mask_value", "not mask_value")},
            loses=("bert_encode_batch_shapes",), message="torch.long"),
    Variant("bert_returns_lists", {BERT: bert_pipeline().replace(
        'return {"input_ids": input_ids, "attention_mask": mask}',
        'return {"input_ids": input_ids.tolist(), "attention_mask": mask.tolist()}')},
            loses=("bert_encode_batch_shapes", "bert_encode_batch_ids"), message="tensor"),
    # Hard-coding the visible batch earns nothing: the hidden tests use other texts and vocabularies.
    Variant("bert_hard_coded_visible_batch", {BERT: bert("""
    ids = torch.tensor([[2, 101, 116, 338, 107, 18, 3, 0, 0, 0, 0, 0, 0],
                        [2, 332, 251, 151, 55, 112, 75, 127, 53, 258, 349, 5, 3],
                        [2, 162, 35, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0]])
    return {"input_ids": ids, "attention_mask": (ids != 0).long()}
""")}, loses=("bert_encode_batch_shapes",), message="shape"),
    # ---- answers taken from an oracle or a course reference, by routes that patching the library
    # during the test cannot see: a reference captured when the cell runs, before any test, or a
    # wrapper. The watch sees the call itself, so each is refused and flagged for review.
    Variant("train_bpe_trainer_captured_before_the_tests", {TRAIN: """
import json
from tokenizers import Tokenizer, pre_tokenizers, trainers

_train_from_iterator = Tokenizer.train_from_iterator   # captured now, before the tests run

""" + train("""
    tokenizer = Tokenizer(BPE(end_of_word_suffix="</w>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    _train_from_iterator(tokenizer, corpus, trainers.BpeTrainer(vocab_size=100_000, min_frequency=0,
                                                                show_progress=False, end_of_word_suffix="</w>"))
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    return [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges][:num_merges]
""")}, loses=("train_bpe_stays_inside_words",), message="flagged for review"),
    # Model.tokenize is compiled and inherited: called on a BPE, the watch sees it as BPE.tokenize.
    Variant("encode_with_model_tokenize_captured_before_the_tests", {ENCODE: """
_tokenize = BPE.tokenize   # the compiled Model.tokenize, captured now

""" + encode("""
    symbols = set(word) | {c + "</w>" for c in word}
    for left, right in merges:
        symbols |= {left, right, left + right}
    model = BPE(vocab={s: i for i, s in enumerate(sorted(symbols))}, merges=list(merges), end_of_word_suffix="</w>")
    return [token.value for token in _tokenize(model, word)]
""")}, loses=("bpe_encode_known_words", "bpe_encode_matches_tokenizers", "bpe_encode_applies_merges_by_priority"),
            message="flagged for review"),
    # The grader's own oracle (the hidden checks' module is importable in the kernel, since its probes run there):
    # an answer that calls it is taken, whatever the check's list of oracles says.
    Variant("encode_with_the_hidden_checks_reference", {ENCODE: """
import autograder.checks.tokenization as grader_checks

""" + encode("""
    return grader_checks.oracle_encode([word], merges)[word]
""")}, loses=("bpe_encode_known_words", "bpe_encode_matches_tokenizers", "bpe_encode_applies_merges_by_priority"),
            message="grader_checks"),
    Variant("wordpiece_from_transformers_legacy_python", {WORDPIECE: """
from transformers.models.bert.tokenization_bert_legacy import WordpieceTokenizer as _Wordpiece

""" + wordpiece("""
    return _Wordpiece(vocab=vocab, unk_token=unk_token).tokenize(word)
""")}, loses=("wordpiece_continuation_prefix", "wordpiece_longest_match_first", "wordpiece_unknown_words"),
            message="flagged for review"),
    # A wrapper around the course's own BERT pre-tokenizer (courselib.tiny_bert.words_of).
    Variant("bert_split_by_a_wrapper_around_the_course_reference", {BERT: bert_pipeline().replace(SPLIT_WORDS, """
from courselib.tiny_bert import words_of as _words_of

def split_words(text):
    return list(_words_of([text]))
""")},
            loses=("bert_encode_batch_shapes", "bert_encode_batch_ids", "bert_encode_batch_padding_and_mask"),
            message="is not available while 01_tokenization is graded"),
    # ---- bytes_to_unicode
    Variant("byte_table_chr_256_plus_byte", {TABLE: table("""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    return {b: chr(b) if b in printable else chr(256 + b) for b in range(256)}
""")}, loses=("bytes_to_unicode_matches_gpt2",), message="chr(256 + n)"),
    Variant("byte_table_keeps_the_space", {TABLE: table_from("[*range(32, 127), *range(161, 173), *range(174, 256)]")},
            loses=("bytes_to_unicode_printable_bijection", "bytes_to_unicode_matches_gpt2"),
            message="the space (byte 32) becomes 'Ġ'"),
    Variant("byte_table_keeps_the_soft_hyphen", {TABLE: table_from("[*range(33, 127), *range(161, 256)]")},
            loses=("bytes_to_unicode_printable_bijection", "bytes_to_unicode_matches_gpt2"),
            message="whitespace or control characters"),
    # ---- byte_level_pretokenize
    Variant("pretokenize_without_the_space_prefix",
            {PRETOKENIZE: pretokenize_with(pieces='regex.findall(GPT2_PATTERN.replace(" ?", ""), text)')},
            loses=("byte_level_pretokenize_words_and_spaces", "byte_level_pretokenize_unicode"),
            message="the space belongs to the word after it"),
    Variant("pretokenize_after_str_split", {PRETOKENIZE: pretokenize_with(
        pieces='regex.findall(GPT2_PATTERN, " ".join(text.split()))')},
            loses=("byte_level_pretokenize_words_and_spaces", "byte_level_pretokenize_unicode"),
            message="runs of spaces, tabs and newlines must survive"),
    Variant("pretokenize_maps_characters_not_bytes",
            {PRETOKENIZE: pretokenize_with(byte_chars="table.get(ord(c), c) for c in piece")},
            loses=("byte_level_pretokenize_unicode",), message="not its characters"),
    Variant("pretokenize_without_the_byte_table", {PRETOKENIZE: pretokenize_with(byte_chars="piece")},
            loses=("byte_level_pretokenize_words_and_spaces", "byte_level_pretokenize_unicode"),
            message="every byte goes through bytes_to_unicode()"),
    # Hard-coding the visible answers earns nothing: the hidden tests use other texts.
    Variant("pretokenize_hard_coded_visible_answers", {PRETOKENIZE: pretokenize("""
    return {"Hello world": ["Hello", "Ġworld"], "": [], "\\tTab": ["ĉ", "Tab"],
            "It's  2026, isn't it?": ["It", "'s", "Ġ", "Ġ2026", ",", "Ġisn", "'t", "Ġit", "?"],
            "one\\n\\ntwo  three   ": ["one", "Ċ", "Ċ", "two", "Ġ", "Ġthree", "ĠĠĠ"],
            "café": ["cafÃ©"], "cafe\\u0301": ["cafe", "Ìģ"],
            "パン屋が好きです。": ["ãĥĳãĥ³å±ĭãģĮå¥½ãģįãģ§ãģĻ", "ãĢĤ"],
            "Fresh bread 🍞🥐!": ["Fresh", "Ġbread", "ĠðŁįŀðŁ¥Ĳ!"],
            "👍🏽 costs ½ €": ["ðŁĳįðŁı½", "Ġcosts", "ĠÂ½", "ĠâĤ¬"]}.get(text, [])
""")}, loses=("byte_level_pretokenize_words_and_spaces", "byte_level_pretokenize_unicode"), message="expected ['Ġ']"),
    # ---- byte_level_decode
    Variant("decode_token_by_token", {DECODE: decode("""
    byte_of = {char: b for b, char in bytes_to_unicode().items()}
    return "".join(bytes(byte_of[char] for char in token).decode("utf-8", errors="replace") for token in tokens)
""")}, loses=("byte_level_decode_round_trip", "byte_level_decode_cut_characters"), message="not token by token"),
    Variant("decode_as_latin1", {DECODE: decode_with('data.decode("latin-1")')},
            loses=("byte_level_decode_round_trip", "byte_level_decode_cut_characters"), message="as UTF-8"),
    Variant("decode_strict_utf8", {DECODE: decode_with('data.decode("utf-8")')},
            loses=("byte_level_decode_cut_characters",), message="errors='replace'"),
    Variant("decode_ignores_broken_bytes", {DECODE: decode_with('data.decode("utf-8", errors="ignore")')},
            loses=("byte_level_decode_cut_characters",), message="errors='replace'"),
    Variant("decode_only_replaces_the_space_marker", {DECODE: decode("""
    return "".join(tokens).replace("Ġ", " ").replace("Ċ", "\\n")
""")}, loses=("byte_level_decode_round_trip",), message="Map every character back to its byte"),
    # ---- unigram_segment (optional stretch)
    Variant("unigram_greedy_longest_match", {UNIGRAM: unigram("""
    pieces, start = [], 0
    while start < len(word):
        end = next((e for e in range(len(word), start, -1) if word[start:e] in log_probs), None)
        if end is None:
            raise ValueError(f"no split of {word!r}")
        pieces.append(word[start:end])
        start = end
    return pieces
""")}, loses=(UNIGRAM_VALUES, UNIGRAM_GREEDY), message="greedy longest-match"),
    # best[i] from the last piece's log-probability alone: what comes before it is forgotten
    Variant("unigram_scores_the_last_piece_only", {UNIGRAM: unigram_viterbi(score="log_probs[piece]")},
            loses=(UNIGRAM_VALUES,), message="best[j] + log p(word[j:i])"),
    Variant("unigram_adds_probabilities", {UNIGRAM: unigram_viterbi(score="best[start] + math.exp(log_probs[piece])")},
            loses=(UNIGRAM_VALUES,), message="Add the log-probabilities"),
    Variant("unigram_backtracking_drops_the_first_piece", {UNIGRAM: unigram_viterbi(walk_back="while back[end] > 0:")},
            loses=(UNIGRAM_VALUES, UNIGRAM_GREEDY), message="until position 0"),
    Variant("unigram_pieces_in_reverse_order", {UNIGRAM: unigram_viterbi(result="pieces")},
            loses=(UNIGRAM_VALUES,), message="in order"),
    Variant("unigram_returns_nothing_without_a_split", {UNIGRAM: unigram_viterbi(no_split="return []")},
            loses=(UNIGRAM_GREEDY,), message="raise ValueError naming the word"),
    # Hard-coding the visible answers earns nothing: the hidden vocabularies are random.
    Variant("unigram_hard_coded_visible_answers", {UNIGRAM: unigram("""
    answers = {"unrelated": ["un", "related"], "unread": ["un", "read"], "unreading": ["un", "read", "ing"],
               "unrest": ["un", "re", "s", "t"], "readers": ["read", "er", "s"], "related": ["related"],
               "abc": ["a", "bc"]}
    if word not in answers:
        raise ValueError(f"no split of {word!r}")
    return answers[word]
""")}, loses=(UNIGRAM_VALUES, UNIGRAM_GREEDY), message="but the word has a split"),
    # Model.tokenize is compiled and inherited: called on a Unigram, the watch sees it as Unigram.tokenize.
    Variant("unigram_with_the_oracle_captured_before_the_tests", {UNIGRAM: """
_tokenize = Unigram.tokenize   # the compiled Model.tokenize, captured now

""" + unigram("""
    model = Unigram([("<unk>", -1000.0), *log_probs.items()], unk_id=0)
    tokens = _tokenize(model, word)
    if any(token.id == 0 for token in tokens):
        raise ValueError(f"no split of {word!r}")
    return [token.value for token in tokens]
""")}, loses=(UNIGRAM_VALUES, UNIGRAM_GREEDY), message="flagged for review"),
    # ---- the oracles, taken by routes the watch must still see
    # transformers, which graded runs of 01 never import, imported by the answer only when it is called
    Variant("bert_batch_imports_transformers_while_it_runs", {BERT: bert("""
    import importlib
    library = importlib.import_module("trans" + "formers")
    tokenizer = library.BertTokenizerFast(vocab=dict(vocab), do_lower_case=True)
    encoded = tokenizer(list(texts), padding=True, return_tensors="pt")
    return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}
""")}, loses=("bert_encode_batch_shapes", "bert_encode_batch_ids", "bert_encode_batch_padding_and_mask"),
            message="flagged for review"),
    Variant("byte_table_from_transformers", {TABLE: """
from transformers.convert_slow_tokenizer import bytes_to_unicode as _gpt2_table

""" + table("""
    return _gpt2_table()
""")}, loses=("bytes_to_unicode_printable_bijection", "bytes_to_unicode_matches_gpt2"), message="flagged for review"),
    Variant("pretokenize_with_the_byte_level_pre_tokenizer_captured_before_the_tests", {PRETOKENIZE: """
_pre_tokenize_str = pre_tokenizers.ByteLevel(add_prefix_space=False).pre_tokenize_str   # captured now

""" + pretokenize("""
    return [piece for piece, _ in _pre_tokenize_str(text)]
""")}, loses=("byte_level_pretokenize_words_and_spaces", "byte_level_pretokenize_unicode"),
            message="flagged for review"),
    Variant("decode_with_the_byte_level_decoder", {DECODE: decode("""
    return decoders.ByteLevel().decode(list(tokens))
""")}, loses=("byte_level_decode_round_trip", "byte_level_decode_cut_characters"), message="flagged for review"),
]


ALTERNATIVES = [
    # train_bpe: symbols as space-joined strings with a regex replace, as in Sennrich et al.'s paper
    Variant("train_bpe_regex_on_joined_strings", {TRAIN: train("""
    import re
    vocab = Counter()
    for text in corpus:
        for word in text.split():
            vocab[" ".join(list(word[:-1]) + [word[-1] + "</w>"])] += 1
    merges = []
    while len(merges) < num_merges:
        pairs = Counter()
        for spelled, freq in vocab.items():
            symbols = spelled.split(" ")
            for i in range(len(symbols) - 1):
                pairs[symbols[i], symbols[i + 1]] += freq
        if not pairs:
            break
        top = max(pairs.values())
        best = sorted(pair for pair, n in pairs.items() if n == top)[0]
        merges.append(best)
        pattern = re.compile(r"(?<!\\S)" + re.escape(" ".join(best)) + r"(?!\\S)")
        vocab = Counter({pattern.sub("".join(best), spelled): freq for spelled, freq in vocab.items()})
    return merges
""")}),
    # train_bpe: plain dicts of symbol tuples, the best pair found by sorting
    Variant("train_bpe_sorted_counts_and_tuples", {TRAIN: train("""
    freq = {}
    for text in corpus:
        for word in text.split():
            key = tuple(word[:-1]) + (word[-1] + "</w>",)
            freq[key] = freq.get(key, 0) + 1
    merges = []
    for _ in range(num_merges):
        counts = {}
        for symbols, n in freq.items():
            for pair in zip(symbols, symbols[1:]):
                counts[pair] = counts.get(pair, 0) + n
        if not counts:
            break
        (best, _), *_ = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
        merges.append(best)
        new_freq = {}
        for symbols, n in freq.items():
            out = []
            for s in symbols:
                if out and (out[-1], s) == best:   # out[-1] can't be a fresh merge: a+b != a
                    out[-1] = out[-1] + s
                else:
                    out.append(s)
            new_freq[tuple(out)] = new_freq.get(tuple(out), 0) + n
        freq = new_freq
    return merges
""")}),
    # bpe_encode: replay the merges in the order they were learned
    Variant("bpe_encode_replays_merges_in_order", {ENCODE: encode(ENCODE_BY_REPLAYING_MERGES)}),
    Variant("bpe_encode_recursive_best_rank", {ENCODE: encode("""
    rank = {tuple(pair): r for r, pair in enumerate(merges)}
    def step(symbols):
        ranked = [(rank[p], i) for i, p in enumerate(zip(symbols, symbols[1:])) if p in rank]
        if not ranked:
            return symbols
        r, i = min(ranked)
        return step(symbols[:i] + [symbols[i] + symbols[i + 1]] + symbols[i + 2:])
    return step(list(word[:-1]) + [word[-1] + "</w>"])
""")}),
    # wordpiece_tokenize: shrink the candidate from the right, as BERT's reference code does
    Variant("wordpiece_while_loops", {WORDPIECE: wordpiece("""
    tokens = []
    start = 0
    while start < len(word):
        end = len(word)
        current = None
        while start < end:
            candidate = word[start:end]
            if start > 0:
                candidate = "##" + candidate
            if candidate in vocab:
                current = candidate
                break
            end -= 1
        if current is None:
            return [unk_token]
        tokens.append(current)
        start = end
    return tokens
""")}),
    Variant("wordpiece_recursive_on_the_rest", {WORDPIECE: wordpiece("""
    def split(rest, prefix):
        if not rest:
            return []
        for size in range(len(rest), 0, -1):
            if prefix + rest[:size] in vocab:
                tail = split(rest[size:], "##")
                return None if tail is None else [prefix + rest[:size]] + tail
        return None
    pieces = split(word, "")
    return pieces if pieces is not None else [unk_token]
""")}),
    # bert_encode_batch: a regex split and pad_sequence
    Variant("bert_regex_and_pad_sequence", {BERT: bert("""
    from torch.nn.utils.rnn import pad_sequence
    punctuation = re.escape(string.punctuation)
    sequences = []
    for text in texts:
        words = re.findall(rf"[^\\s{punctuation}]+|[{punctuation}]", text.lower())
        tokens = ["[CLS]", *[p for w in words for p in wordpiece_tokenize(w, vocab)], "[SEP]"]
        sequences.append(torch.tensor([vocab[t] for t in tokens]))
    input_ids = pad_sequence(sequences, batch_first=True, padding_value=vocab["[PAD]"])
    lengths = torch.tensor([len(s) for s in sequences])
    attention_mask = (torch.arange(input_ids.shape[1])[None, :] < lengths[:, None]).long()
    return {"input_ids": input_ids, "attention_mask": attention_mask}
""")}),
    Variant("bert_character_loop_and_lists", {BERT: SPLIT_WORDS + bert("""
    rows = [[vocab["[CLS]"]] + [vocab[p] for w in split_words(t) for p in wordpiece_tokenize(w, vocab)] + [vocab["[SEP]"]]
            for t in texts]
    width = max(map(len, rows))
    pad = vocab["[PAD]"]
    return {"input_ids": torch.tensor([r + [pad] * (width - len(r)) for r in rows]),
            "attention_mask": torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])}
""")}),
    # bytes_to_unicode: GPT-2's own construction (openai/gpt-2, encoder.py), two parallel lists
    Variant("byte_table_as_gpt2_builds_it", {TABLE: table("""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(2 ** 8):
        if b not in bs:
            bs.append(b)
            cs.append(2 ** 8 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))
""")}),
    # bytes_to_unicode: "printable and not whitespace" picks exactly GPT-2's 188 bytes
    Variant("byte_table_from_isprintable", {TABLE: table("""
    table, n = {}, 0
    for b in range(256):
        if chr(b).isprintable() and not chr(b).isspace():
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return table
""")}),
    Variant("pretokenize_finditer_and_loops", {PRETOKENIZE: pretokenize("""
    chars = [bytes_to_unicode()[b] for b in range(256)]
    pieces = []
    for match in regex.finditer(GPT2_PATTERN, text):
        piece = ""
        for b in bytearray(match.group(), "utf-8"):
            piece += chars[b]
        pieces.append(piece)
    return pieces
""")}),
    Variant("decode_bytearray_loop", {DECODE: decode("""
    inverse = {}
    for b, char in bytes_to_unicode().items():
        inverse[char] = b
    data = bytearray()
    for token in tokens:
        for char in token:
            data.append(inverse[char])
    return bytes(data).decode("utf-8", "replace")
""")}),
    # byte_level_decode as a stream, the way text is shown while a model generates it
    Variant("decode_incrementally", {DECODE: decode("""
    import codecs
    inverse = {char: b for b, char in bytes_to_unicode().items()}
    stream = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = "".join(stream.decode(bytes(inverse[char] for char in token)) for token in tokens)
    return text + stream.decode(b"", final=True)
""")}),
    # unigram_segment: the best split of each suffix, memoised (recursion instead of a table)
    Variant("unigram_memoised_recursion_on_suffixes", {UNIGRAM: unigram("""
    import functools

    @functools.lru_cache(maxsize=None)
    def best_from(start):
        # (total log-probability, pieces) of the best split of word[start:], or None if there is none
        if start == len(word):
            return 0.0, ()
        options = []
        for end in range(start + 1, len(word) + 1):
            piece = word[start:end]
            rest = best_from(end) if piece in log_probs else None
            if rest is not None:
                options.append((log_probs[piece] + rest[0], (piece,) + rest[1]))
        return max(options, key=lambda option: option[0]) if options else None

    found = best_from(0)
    if found is None:
        raise ValueError(f"{word!r} cannot be split into pieces of the vocabulary")
    return list(found[1])
""")}),
    # unigram_segment: the same table filled forwards, from each reachable start to every end
    Variant("unigram_forward_over_start_positions", {UNIGRAM: unigram("""
    longest = max(map(len, log_probs), default=0)
    best = {0: (0.0, None)}                 # position: (total, start of the last piece)
    for start in range(len(word)):
        if start not in best:
            continue
        for end in range(start + 1, min(len(word), start + longest) + 1):
            piece = word[start:end]
            if piece in log_probs:
                total = best[start][0] + log_probs[piece]
                if end not in best or total > best[end][0]:
                    best[end] = (total, start)
    if len(word) not in best:
        raise ValueError("no split for " + word)
    pieces, end = [], len(word)
    while end:
        start = best[end][1]
        pieces.insert(0, word[start:end])
        end = start
    return pieces
""")}),
    # unigram_segment: each prefix keeps its whole best split, no back-pointers
    Variant("unigram_keeps_whole_splits", {UNIGRAM: unigram("""
    best = [(0.0, [])] + [None] * len(word)
    for end in range(1, len(word) + 1):
        candidates = [(best[start][0] + log_probs[word[start:end]], best[start][1] + [word[start:end]])
                      for start in range(end) if best[start] is not None and word[start:end] in log_probs]
        if candidates:
            best[end] = max(candidates, key=lambda candidate: candidate[0])
    if best[-1] is None:
        raise ValueError(f"unigram_segment: {word} has no split")
    return best[-1][1]
""")}),
    # A correct answer whose libraries warn on stderr must not lose a single point.
    Variant("all_correct_but_noisy_on_stderr", {
        TRAIN: train(WARN_AND_PRINT + """
    return train_bpe_reference(corpus, num_merges)

def train_bpe_reference(corpus, num_merges):
    word_counts = Counter(word for text in corpus for word in text.split())
    splits = {word: list(word[:-1]) + [word[-1] + "</w>"] for word in word_counts}
    merges = []
    for _ in range(num_merges):
        pairs = Counter()
        for word, count in word_counts.items():
            for pair in zip(splits[word], splits[word][1:]):
                pairs[pair] += count
        if not pairs:
            break
        best = min(pairs, key=lambda pair: (-pairs[pair], pair))
        merges.append(best)
        for word, symbols in splits.items():
            i = 0
            while i < len(symbols) - 1:
                if (symbols[i], symbols[i + 1]) == best:
                    symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]
                i += 1
    return merges
"""),
        ENCODE: encode(WARN_AND_PRINT + """
    symbols = list(word[:-1]) + [word[-1] + "</w>"]
    for left, right in merges:
        i = 0
        while i < len(symbols) - 1:
            if (symbols[i], symbols[i + 1]) == (left, right):
                symbols[i:i + 2] = [left + right]
            i += 1
    return symbols
"""),
        WORDPIECE: wordpiece(WARN_AND_PRINT + """
    pieces, start = [], 0
    while start < len(word):
        end = next((e for e in range(len(word), start, -1)
                    if (word[start:e] if start == 0 else "##" + word[start:e]) in vocab), None)
        if end is None:
            return [unk_token]
        pieces.append(word[start:end] if start == 0 else "##" + word[start:end])
        start = end
    return pieces
"""),
        BERT: bert_pipeline().replace("    rows = []", WARN_AND_PRINT + "    rows = []"),
    }),
]
