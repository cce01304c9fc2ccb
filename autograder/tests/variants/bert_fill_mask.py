"""Mutants and alternative correct answers for 08_bert_fill_mask."""
from autograder.tests.variants import Variant

ASSIGNMENT = "08_bert_fill_mask"
MASK = "mask_tokens_answer"
LOSS = "mlm_loss_answer"
FILL = "fill_mask_answer"
TOPK = "top_k_accuracy_answer"


def mask_tokens(body):
    return ("def mask_tokens(input_ids, mask_token_id, vocab_size, special_tokens_mask=None, mlm_probability=0.15,\n"
            "                generator=None):\n" + body)


def mlm_loss(body):
    return "def mlm_loss(logits, labels):\n" + body


def fill_mask(body):
    return "def fill_mask(model, tokenizer, text, top_k=5):\n" + body


def top_k_accuracy(body):
    return "def top_k_accuracy(model, tokenizer, examples, k):\n" + body


SELECT = """
    inputs, labels = input_ids.clone(), input_ids.clone()
    probability = torch.full(input_ids.shape, mlm_probability)
    if special_tokens_mask is not None:
        probability.masked_fill_(special_tokens_mask.bool(), 0.0)
    selected = torch.bernoulli(probability, generator=generator).bool()
    labels[~selected] = -100
"""

CORRUPT_80_10_10 = """
    to_mask = selected & (torch.rand(input_ids.shape, generator=generator) < 0.8)
    inputs[to_mask] = mask_token_id
    to_random = selected & ~to_mask & (torch.rand(input_ids.shape, generator=generator) < 0.5)
    inputs[to_random] = torch.randint(vocab_size, input_ids.shape, generator=generator)[to_random]
    return inputs, labels
"""

FILL_START = """
    input_ids = tokenizer(text, return_tensors="pt")["input_ids"]
    position = (input_ids[0] == tokenizer.mask_token_id).nonzero()[0, 0].item()
    with torch.no_grad():
        logits = model(input_ids=input_ids).logits
"""

FILL_END = """
    predictions = []
    for score, token in zip(scores.tolist(), tokens.tolist()):
        filled = input_ids[0].clone()
        filled[position] = token
        predictions.append({"score": score, "token": token, "token_str": tokenizer.decode([token]),
                            "sequence": tokenizer.decode(filled, skip_special_tokens=True)})
    return predictions
"""

MUTANTS = [
    # ---- mask_tokens
    Variant("mask_10_10_80", {MASK: mask_tokens(SELECT + """
    to_mask = selected & (torch.rand(input_ids.shape, generator=generator) < 0.1)
    inputs[to_mask] = mask_token_id
    to_random = selected & ~to_mask & (torch.rand(input_ids.shape, generator=generator) < 0.1 / 0.9)
    inputs[to_random] = torch.randint(vocab_size, input_ids.shape, generator=generator)[to_random]
    return inputs, labels
""")}, loses=("mask_tokens_rates",), message="10/10/80"),
    Variant("mask_special_tokens_too", {MASK: mask_tokens("""
    inputs, labels = input_ids.clone(), input_ids.clone()
    selected = torch.rand(input_ids.shape, generator=generator) < mlm_probability
    labels[~selected] = -100
""" + CORRUPT_80_10_10)}, loses=("mask_tokens_special_tokens",), message="special tokens"),
    Variant("mask_labels_not_ignored", {MASK: mask_tokens(SELECT + """
    labels = input_ids.clone()
""" + CORRUPT_80_10_10)}, loses=("mask_tokens_labels",), message="-100"),
    Variant("mask_labels_zero_not_minus_100", {MASK: mask_tokens(SELECT + """
    labels[~selected] = 0
""" + CORRUPT_80_10_10)}, loses=("mask_tokens_labels",), message="-100"),
    Variant("mask_labels_are_corrupted_inputs", {MASK: mask_tokens(SELECT + """
    to_mask = selected & (torch.rand(input_ids.shape, generator=generator) < 0.8)
    inputs[to_mask] = mask_token_id
    to_random = selected & ~to_mask & (torch.rand(input_ids.shape, generator=generator) < 0.5)
    inputs[to_random] = torch.randint(vocab_size, input_ids.shape, generator=generator)[to_random]
    labels[selected] = inputs[selected]
    return inputs, labels
""")}, loses=("mask_tokens_labels",), message="original token"),
    Variant("mask_modifies_input_in_place", {MASK: mask_tokens("""
    labels = input_ids.clone()
    inputs = input_ids
    probability = torch.full(input_ids.shape, mlm_probability)
    if special_tokens_mask is not None:
        probability.masked_fill_(special_tokens_mask.bool(), 0.0)
    selected = torch.bernoulli(probability, generator=generator).bool()
    labels[~selected] = -100
""" + CORRUPT_80_10_10)}, loses=("mask_tokens_labels",), message="in place"),
    Variant("mask_random_overwrites_masks", {MASK: mask_tokens(SELECT + """
    to_mask = selected & (torch.rand(input_ids.shape, generator=generator) < 0.8)
    inputs[to_mask] = mask_token_id
    to_random = selected & (torch.rand(input_ids.shape, generator=generator) < 0.1)
    inputs[to_random] = torch.randint(vocab_size, input_ids.shape, generator=generator)[to_random]
    return inputs, labels
""")}, loses=("mask_tokens_rates",), message="NOT masked"),
    Variant("mask_hard_coded_probability", {MASK: mask_tokens("""
    inputs, labels = input_ids.clone(), input_ids.clone()
    probability = torch.full(input_ids.shape, 0.15)
    if special_tokens_mask is not None:
        probability.masked_fill_(special_tokens_mask.bool(), 0.0)
    selected = torch.bernoulli(probability, generator=generator).bool()
    labels[~selected] = -100
""" + CORRUPT_80_10_10)}, loses=("mask_tokens_rates",), message="mlm_probability"),
    Variant("mask_ignores_generator", {MASK: mask_tokens("""
    inputs, labels = input_ids.clone(), input_ids.clone()
    probability = torch.full(input_ids.shape, mlm_probability)
    if special_tokens_mask is not None:
        probability.masked_fill_(special_tokens_mask.bool(), 0.0)
    selected = torch.bernoulli(probability).bool()
    labels[~selected] = -100
    to_mask = selected & (torch.rand(input_ids.shape) < 0.8)
    inputs[to_mask] = mask_token_id
    to_random = selected & ~to_mask & (torch.rand(input_ids.shape) < 0.5)
    inputs[to_random] = torch.randint(vocab_size, input_ids.shape)[to_random]
    return inputs, labels
""")}, loses=("mask_tokens_generator",), message="generator"),
    # The oracle, taken where no patch of its name could see it: DataCollatorForLanguageModeling's own
    # masking behind a stand-in tokenizer. The watch sees its code run: flagged for review, 0 points.
    Variant("mask_through_the_collator", {MASK: '''
from transformers import DataCollatorForLanguageModeling


class _Vocabulary:  # just what the collator reads from a tokenizer
    mask_token, pad_token, is_fast = "[MASK]", "[PAD]", True

    def __init__(self, mask_token_id, size):
        self.mask_token_id, self.size = mask_token_id, size

    def convert_tokens_to_ids(self, token):
        return self.mask_token_id

    def __len__(self):
        return self.size

    def get_special_tokens_mask(self, ids, already_has_special_tokens=True):
        return [0] * len(ids)

''' + mask_tokens("""
    collator = DataCollatorForLanguageModeling(_Vocabulary(mask_token_id, vocab_size), mlm_probability=mlm_probability)
    collator.generator = generator
    return collator.torch_mask_tokens(input_ids.clone(), special_tokens_mask)
""")}, loses=("mask_tokens_labels", "mask_tokens_rates", "mask_tokens_special_tokens", "mask_tokens_generator"),
        message="flagged for review"),
    # Hard-coding what the visible test saw earns nothing: the hidden tests use other shapes and seeds.
    Variant("mask_hard_coded_visible_batch", {MASK: mask_tokens("""
    ids = torch.randint(5, 1000, (4, 300), generator=torch.Generator().manual_seed(0))
    labels = torch.full(ids.shape, -100)
    labels[:, ::7] = ids[:, ::7]
    inputs = ids.clone()
    inputs[:, ::7] = mask_token_id
    return inputs, labels
""")}, loses=("mask_tokens_labels", "mask_tokens_rates", "mask_tokens_special_tokens"), message="shape"),
    # ---- mlm_loss
    Variant("loss_averages_over_ignored_positions", {LOSS: mlm_loss("""
    per_token = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
    return per_token.mean()
""")}, loses=("mlm_loss_values",), message="every position"),
    Variant("loss_mean_of_sequence_means", {LOSS: mlm_loss("""
    per_token = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none")
    counts = (labels != -100).sum(dim=1)
    return (per_token.sum(dim=1) / counts).mean()
""")}, loses=("mlm_loss_values",), message="count once"),
    Variant("loss_sums_instead_of_mean", {LOSS: mlm_loss("""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum")
""")}, loses=("mlm_loss_values",), message="summed"),
    Variant("loss_without_log_softmax", {LOSS: mlm_loss("""
    predicted = labels != -100
    return -logits[predicted].gather(1, labels[predicted][:, None]).mean()
""")}, loses=("mlm_loss_values",), message="log-softmax"),
    Variant("loss_returns_a_python_float", {LOSS: mlm_loss("""
    return torch.tensor(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)).item())
""")}, loses=("mlm_loss_ignores_positions",), message="requires_grad"),
    Variant("loss_hard_coded_visible_value", {LOSS: mlm_loss("""
    return torch.tensor(0.10291114, requires_grad=True) * 1.0  # the visible example's answer
""")}, loses=("mlm_loss_values",), message="mlm_loss is wrong"),
    # ---- fill_mask
    Variant("fill_softmax_over_sequence_axis", {FILL: fill_mask(FILL_START + """
    probabilities = logits.softmax(dim=1)[0, position]
    scores, tokens = probabilities.topk(top_k)
""" + FILL_END)}, loses=("fill_mask_matches_pipeline", "fill_mask_scores_are_sorted_probabilities"),
        message="sequence axis"),
    Variant("fill_top_k_unsorted", {FILL: fill_mask(FILL_START + """
    probabilities = logits[0, position].softmax(dim=-1)
    tokens = probabilities.argsort()[-top_k:]
    scores = probabilities[tokens]
""" + FILL_END)}, loses=("fill_mask_matches_pipeline", "fill_mask_scores_are_sorted_probabilities"),
        message="order"),
    Variant("fill_raw_logits_as_scores", {FILL: fill_mask(FILL_START + """
    scores, tokens = logits[0, position].topk(top_k)
""" + FILL_END)}, loses=("fill_mask_matches_pipeline", "fill_mask_scores_are_sorted_probabilities"),
        message="raw logits"),
    Variant("fill_mask_position_ignores_cls", {FILL: fill_mask("""
    input_ids = tokenizer(text, return_tensors="pt")["input_ids"]
    position = text.split().index(next(w for w in text.split() if tokenizer.mask_token in w))
    with torch.no_grad():
        logits = model(input_ids=input_ids).logits
    scores, tokens = logits[0, position].softmax(dim=-1).topk(top_k)
""" + FILL_END)}, loses=("fill_mask_matches_pipeline",), message="[CLS]"),
    Variant("fill_sequence_keeps_special_tokens", {FILL: fill_mask(FILL_START + """
    scores, tokens = logits[0, position].softmax(dim=-1).topk(top_k)
    predictions = []
    for score, token in zip(scores.tolist(), tokens.tolist()):
        filled = input_ids[0].clone()
        filled[position] = token
        predictions.append({"score": score, "token": token, "token_str": tokenizer.decode([token]),
                            "sequence": tokenizer.decode(filled)})
    return predictions
""")}, loses=("fill_mask_matches_pipeline",), message="skip_special_tokens"),
    Variant("fill_returns_tensors", {FILL: fill_mask(FILL_START + """
    scores, tokens = logits[0, position].softmax(dim=-1).topk(top_k)
    predictions = []
    for score, token in zip(scores, tokens):
        filled = input_ids[0].clone()
        filled[position] = token
        predictions.append({"score": score, "token": token, "token_str": tokenizer.decode([token]),
                            "sequence": tokenizer.decode(filled, skip_special_tokens=True)})
    return predictions
""")}, loses=("fill_mask_format",), message="Python"),
    Variant("fill_calls_the_pipeline", {FILL: fill_mask("""
    return pipeline("fill-mask", model=model, tokenizer=tokenizer)(text, top_k=top_k)
""")}, loses=("fill_mask_format", "fill_mask_matches_pipeline"), message="by hand"),
    # The pipeline run stage by stage, its top-k captured before the test: no patch of __call__ sees it.
    Variant("fill_pipeline_stages_captured_early", {FILL: '''
from transformers.pipelines.fill_mask import FillMaskPipeline

_top_k = FillMaskPipeline.postprocess  # captured before any test runs

''' + fill_mask("""
    unmask = pipeline("fill-mask", model=model, tokenizer=tokenizer)
    with torch.no_grad():
        return _top_k(unmask, unmask.forward(unmask.preprocess(text)), top_k=top_k)
""")}, loses=("fill_mask_format", "fill_mask_matches_pipeline", "fill_mask_scores_are_sorted_probabilities"),
        message="flagged for review"),
    # The tiny model's answer to the visible sentence, typed in: it passes the visible tests, nothing else.
    Variant("fill_hard_coded_visible_answer", {FILL: fill_mask("""
    return [{"score": 0.12434612214565277, "token": 1717, "token_str": "blanket", "sequence": "the cat sat on the blanket."},
            {"score": 0.117525614798069, "token": 531, "token_str": "couch", "sequence": "the cat sat on the couch."},
            {"score": 0.11259573698043823, "token": 1158, "token_str": "chair", "sequence": "the cat sat on the chair."},
            {"score": 0.10960500687360764, "token": 1689, "token_str": "carpet", "sequence": "the cat sat on the carpet."},
            {"score": 0.09919250756502151, "token": 211, "token_str": "rug", "sequence": "the cat sat on the rug."}]
""")}, loses=("fill_mask_format", "fill_mask_matches_pipeline", "fill_mask_scores_are_sorted_probabilities"),
        message="returned 5 predictions"),
    # ---- top_k_accuracy
    Variant("accuracy_counts_hits", {TOPK: top_k_accuracy("""
    return sum(answer in [p["token_str"] for p in fill_mask(model, tokenizer, text, top_k=k)]
               for text, answer in examples)
""")}, loses=("top_k_accuracy_values",), message="number of hits"),
    Variant("accuracy_ignores_k", {TOPK: top_k_accuracy("""
    return sum(fill_mask(model, tokenizer, text, top_k=1)[0]["token_str"] == answer
               for text, answer in examples) / len(examples)
""")}, loses=("top_k_accuracy_values",), message="ignores k"),
    Variant("accuracy_off_by_one_in_k", {TOPK: top_k_accuracy("""
    return sum(answer in [p["token_str"] for p in fill_mask(model, tokenizer, text, top_k=k)][:k - 1]
               for text, answer in examples) / len(examples)
""")}, loses=("top_k_accuracy_values",), message="off-by-one"),
    Variant("accuracy_answer_anywhere_in_sentence", {TOPK: top_k_accuracy("""
    return sum(any(answer in p["sequence"] for p in fill_mask(model, tokenizer, text, top_k=k))
               for text, answer in examples) / len(examples)
""")}, loses=("top_k_accuracy_values",), message="anywhere in the filled-in sentence"),
    Variant("accuracy_hard_coded_visible_value", {TOPK: top_k_accuracy("""
    return 0.6666666666666666  # the tiny model's visible top-5 accuracy
""")}, loses=("top_k_accuracy_values", "top_k_accuracy_grows_with_k"), message="expected"),
]

WARN_AND_PRINT = """
    import logging, sys, warnings
    warnings.warn("a library deprecation warning", UserWarning)
    print("a library writing to stderr", file=sys.stderr)
    logging.getLogger("transformers.some_module").warning("a transformers warning")
"""

ALTERNATIVES = [
    # mask_tokens: one uniform draw per stage, thresholds instead of Bernoulli trials
    Variant("mask_uniform_thresholds", {MASK: mask_tokens("""
    eligible = torch.ones_like(input_ids, dtype=torch.bool)
    if special_tokens_mask is not None:
        eligible = ~special_tokens_mask.bool()
    selected = (torch.rand(input_ids.shape, generator=generator) < mlm_probability) & eligible
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, -100))
    u = torch.rand(input_ids.shape, generator=generator)
    random_ids = torch.randint(0, vocab_size, input_ids.shape, generator=generator)
    inputs = torch.where(selected & (u < 0.8), torch.full_like(input_ids, mask_token_id), input_ids)
    inputs = torch.where(selected & (u >= 0.8) & (u < 0.9), random_ids, inputs)
    return inputs, labels
""")}),
    # mask_tokens: the original BERT's way, an exact 15% per sequence chosen by a random permutation
    Variant("mask_exact_count_per_sequence", {MASK: mask_tokens("""
    inputs, labels = input_ids.clone(), torch.full_like(input_ids, -100)
    special = (special_tokens_mask.bool() if special_tokens_mask is not None
               else torch.zeros_like(input_ids, dtype=torch.bool))
    for row in range(input_ids.shape[0]):
        candidates = (~special[row]).nonzero().flatten()
        count = round(mlm_probability * len(candidates))
        chosen = candidates[torch.randperm(len(candidates), generator=generator)[:count]]
        labels[row, chosen] = input_ids[row, chosen]
        n_mask, n_random = round(0.8 * count), round(0.1 * count)
        order = chosen[torch.randperm(count, generator=generator)]
        inputs[row, order[:n_mask]] = mask_token_id
        random_positions = order[n_mask:n_mask + n_random]
        inputs[row, random_positions] = torch.randint(vocab_size, (len(random_positions),), generator=generator)
    return inputs, labels
""")}),
    Variant("loss_log_softmax_gather", {LOSS: mlm_loss("""
    predicted = labels != -100                                       # (B, T)
    log_probs = logits.log_softmax(dim=-1)[predicted]                # (N, V)
    return -log_probs.gather(1, labels[predicted].unsqueeze(1)).mean()
""")}),
    Variant("loss_classes_on_axis_1", {LOSS: mlm_loss("""
    return torch.nn.CrossEntropyLoss()(logits.transpose(1, 2), labels)
""")}),
    Variant("fill_softmax_then_sort", {FILL: fill_mask("""
    encoded = tokenizer(text, return_tensors="pt")
    ids = encoded["input_ids"][0].tolist()
    position = ids.index(tokenizer.mask_token_id)
    with torch.no_grad():
        log_probs = torch.log_softmax(model(**encoded).logits, dim=-1)[0, position]
    order = torch.sort(log_probs, descending=True).indices[:top_k].tolist()
    results = []
    for token in order:
        filled = ids[:position] + [token] + ids[position + 1:]
        results.append(dict(score=float(log_probs[token].exp()), token=int(token),
                            token_str=tokenizer.decode([token]),
                            sequence=tokenizer.decode(filled, skip_special_tokens=True)))
    return results
""")}),
    Variant("fill_convert_tokens_to_string", {FILL: fill_mask("""
    encoded = tokenizer(text, return_tensors="pt")
    position = torch.where(encoded.input_ids[0] == tokenizer.mask_token_id)[0].item()
    with torch.no_grad():
        probabilities = F.softmax(model(**encoded).logits[0, position], dim=0)
    top = torch.topk(probabilities, k=top_k)
    out = []
    for score, token in zip(top.values.tolist(), top.indices.tolist()):
        ids = encoded.input_ids[0].tolist()
        ids[position] = token
        out.append({"token": token, "score": score, "token_str": tokenizer.decode([token]),
                    "sequence": tokenizer.decode(ids, skip_special_tokens=True)})
    return out
""")}),
    Variant("accuracy_batched_forward", {TOPK: top_k_accuracy("""
    texts = [text for text, _ in examples]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits                              # (N, T, V)
    rows, positions = (batch["input_ids"] == tokenizer.mask_token_id).nonzero(as_tuple=True)
    top = logits[rows, positions].topk(k, dim=-1).indices          # (N, k)
    hits = [answer in [tokenizer.decode([t]) for t in top[i].tolist()] for i, (_, answer) in enumerate(examples)]
    return sum(hits) / len(examples)
""")}),
    Variant("accuracy_with_the_pipeline", {TOPK: top_k_accuracy("""
    unmask = pipeline("fill-mask", model=model, tokenizer=tokenizer)
    correct = [answer in {p["token_str"] for p in unmask(text, top_k=k)} for text, answer in examples]
    return float(np.mean(correct))
""")}),
    # A correct answer whose libraries warn on stderr must not lose a single point.
    Variant("all_correct_but_noisy_on_stderr", {
        MASK: mask_tokens(WARN_AND_PRINT + SELECT + CORRUPT_80_10_10),
        LOSS: mlm_loss(WARN_AND_PRINT + """
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
"""),
        FILL: fill_mask(WARN_AND_PRINT + FILL_START + """
    scores, tokens = logits[0, position].softmax(dim=-1).topk(top_k)
""" + FILL_END),
        TOPK: top_k_accuracy(WARN_AND_PRINT + """
    return sum(answer in [p["token_str"] for p in fill_mask(model, tokenizer, text, top_k=k)]
               for text, answer in examples) / len(examples)
""")}),
]

# ---------------------------------------------------------------- exercise 4: MaskedLMHead
HEAD = "masked_lm_head_answer"

HEAD_INIT = """
        self.dense = nn.Linear(d_model, d_model)
        self.norm = LayerNorm(d_model, eps)
        self.decoder = nn.Linear(d_model, vocab_size)
        self.decoder.weight = embeddings.weight
"""
HEAD_FORWARD = """
        return self.decoder(self.norm(F.gelu(self.dense(hidden))))
"""


def masked_lm_head(init=HEAD_INIT, forward=HEAD_FORWARD, before=""):
    return (before + "class MaskedLMHead(nn.Module):\n"
            "    def __init__(self, embeddings, eps=1e-12):\n"
            "        super().__init__()\n"
            "        vocab_size, d_model = embeddings.weight.shape\n" + init
            + "\n    def forward(self, hidden):\n" + forward)


HEAD_TESTS = ("masked_lm_head_structure", "masked_lm_head_values", "masked_lm_head_tiny_bert")

MUTANTS += [
    # A copy of the embedding matrix: the same numbers when built, then the encoder is loaded or trained.
    Variant("head_decoder_a_copy_not_tied", {HEAD: masked_lm_head(HEAD_INIT.replace(
        "self.decoder.weight = embeddings.weight",
        "self.decoder.weight = nn.Parameter(embeddings.weight.detach().clone())"))},
        loses=HEAD_TESTS, message="TIED"),
    Variant("head_decoder_copies_into_its_own_weight", {HEAD: masked_lm_head(HEAD_INIT.replace(
        "self.decoder.weight = embeddings.weight", "self.decoder.weight.data.copy_(embeddings.weight)"))},
        loses=HEAD_TESTS, message="TIED"),
    Variant("head_decoder_without_bias", {HEAD: masked_lm_head(HEAD_INIT.replace(
        "nn.Linear(d_model, vocab_size)", "nn.Linear(d_model, vocab_size, bias=False)"))},
        loses=HEAD_TESTS, message="has no bias"),
    Variant("head_decoder_bias_not_added", {HEAD: masked_lm_head(forward="""
        return F.linear(self.norm(F.gelu(self.dense(hidden))), self.decoder.weight)
""")}, loses=("masked_lm_head_values", "masked_lm_head_tiny_bert"), message="bias is missing"),
    Variant("head_without_layer_norm", {HEAD: masked_lm_head(forward="""
        return self.decoder(F.gelu(self.dense(hidden)))
""")}, loses=("masked_lm_head_values", "masked_lm_head_tiny_bert"), message="LayerNorm is missing"),
    Variant("head_without_transform", {HEAD: masked_lm_head(forward="""
        return self.decoder(hidden)
""")}, loses=("masked_lm_head_values", "masked_lm_head_tiny_bert"), message="transform"),
    Variant("head_relu", {HEAD: masked_lm_head(forward="""
        return self.decoder(self.norm(F.relu(self.dense(hidden))))
""")}, loses=("masked_lm_head_values", "masked_lm_head_tiny_bert"), message="ReLU"),
    Variant("head_tanh_gelu", {HEAD: masked_lm_head(forward="""
        return self.decoder(self.norm(F.gelu(self.dense(hidden), approximate="tanh")))
""")}, loses=("masked_lm_head_values", "masked_lm_head_tiny_bert"), message="tanh"),
    Variant("head_torch_layer_norm_default_eps", {HEAD: masked_lm_head(HEAD_INIT.replace(
        "LayerNorm(d_model, eps)", "nn.LayerNorm(d_model)"))},
        loses=("masked_lm_head_structure", "masked_lm_head_values"), message="1e-12"),
    Variant("head_layer_norm_eps_1e-5_in_forward", {HEAD: masked_lm_head(forward="""
        x = F.gelu(self.dense(hidden))
        return self.decoder(F.layer_norm(x, x.shape[-1:], self.norm.weight, self.norm.bias, eps=1e-5))
""")}, loses=("masked_lm_head_values",), message="eps 1e-5"),
    Variant("head_ignores_the_eps_argument", {HEAD: masked_lm_head(HEAD_INIT.replace(
        "LayerNorm(d_model, eps)", "LayerNorm(d_model)"))},
        loses=("masked_lm_head_structure", "masked_lm_head_values"), message="pass the eps argument on"),
    # Right on exactly the widths the visible tests use (16, 24 and the tiny BERT's 128), tanh-GELU elsewhere.
    Variant("head_hard_coded_visible_widths", {HEAD: masked_lm_head(forward="""
        exact = hidden.shape[-1] in (16, 24, 128)
        return self.decoder(self.norm(F.gelu(self.dense(hidden), approximate="none" if exact else "tanh")))
""")}, loses=("masked_lm_head_values", "masked_lm_head_structure"), message="tanh"),
    # transformers' own transform inside: right numbers, but flagged.
    Variant("head_uses_transformers_transform", {HEAD: masked_lm_head("""
        from transformers import BertConfig
        from transformers.models.bert.modeling_bert import BertPredictionHeadTransform
        self.transform = BertPredictionHeadTransform(BertConfig(hidden_size=d_model, layer_norm_eps=eps))
        self.dense, self.norm = self.transform.dense, self.transform.LayerNorm
        self.decoder = nn.Linear(d_model, vocab_size)
        self.decoder.weight = embeddings.weight
""", """
        return self.decoder(self.transform(hidden))
""")}, loses=HEAD_TESTS, message="flagged for review"),
]

ALTERNATIVES += [
    # No nn.Linear for the decoder: a small module that reads the embedding's weight and applies F.linear.
    Variant("head_f_linear_with_the_embedding_weight", {HEAD: masked_lm_head("""
        self.dense = nn.Linear(d_model, d_model)
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.decoder = TiedDecoder(embeddings)
""", """
        return self.decoder(self.norm(F.gelu(self.dense(hidden), approximate="none")))
""", before='''
class TiedDecoder(nn.Module):
    """x @ E.T + bias, E the embedding matrix itself."""

    def __init__(self, embeddings):
        super().__init__()
        self.embeddings = embeddings
        self.bias = nn.Parameter(torch.zeros(embeddings.num_embeddings))

    @property
    def weight(self):
        return self.embeddings.weight

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


''')}),
    # nn.Linear whose weight is assigned the embedding's Parameter, the maths written out by hand.
    Variant("head_by_hand_erf_and_layer_norm", {HEAD: masked_lm_head("""
        self.eps = eps
        self.dense = nn.Linear(d_model, d_model)
        self.norm = nn.Module()
        self.norm.weight = nn.Parameter(torch.ones(d_model))
        self.norm.bias = nn.Parameter(torch.zeros(d_model))
        self.norm.eps = eps
        self.decoder = nn.Linear(d_model, vocab_size)
        del self.decoder.weight
        self.decoder.weight = embeddings.weight
""", """
        x = self.dense(hidden)
        x = 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
        x = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + self.eps)
        x = x * self.norm.weight + self.norm.bias
        return x @ self.decoder.weight.T + self.decoder.bias
""")}),
    Variant("head_gelu_module_in_a_sequential", {HEAD: masked_lm_head("""
        self.dense = nn.Linear(d_model, d_model)
        self.activation = nn.GELU()
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.decoder = nn.Linear(d_model, vocab_size)
        self.decoder.weight = embeddings.weight
        self.transform = nn.Sequential(self.dense, self.activation, self.norm)
""", """
        return self.decoder(self.transform(hidden))
""")}),
]


# ---- pseudo_log_likelihood (optional stretch)
PLL = "pseudo_log_likelihood_answer"
PLL_TESTS = ("stretch_pseudo_log_likelihood_values", "stretch_pseudo_log_likelihood_one_pass")


def pseudo_log_likelihood(body):
    return "def pseudo_log_likelihood(model, input_ids, mask_token_id, special_tokens_mask):\n" + body


PLL_POSITIONS = """
    positions = (~special_tokens_mask.bool()).nonzero()[:, 0]
    rows = torch.arange(len(positions))
"""

MUTANTS += [
    # the answer is in the input: one pass over the unmasked sentence
    Variant("pll_scores_the_unmasked_sentence", {PLL: pseudo_log_likelihood(PLL_POSITIONS + """
    with torch.no_grad():
        logits = model(input_ids=input_ids[None]).logits[0]
    return logits[positions].log_softmax(-1)[rows, input_ids[positions]].sum().item()
""")}, loses=PLL_TESTS, message="unmasked sentence"),
    Variant("pll_masks_every_position_at_once", {PLL: pseudo_log_likelihood(PLL_POSITIONS + """
    masked = input_ids.masked_fill(~special_tokens_mask.bool(), mask_token_id)
    with torch.no_grad():
        logits = model(input_ids=masked[None]).logits[0]
    return logits[positions].log_softmax(-1)[rows, input_ids[positions]].sum().item()
""")}, loses=PLL_TESTS, message="every position at once"),
    Variant("pll_scores_cls_and_sep_too", {PLL: pseudo_log_likelihood("""
    positions = torch.arange(len(input_ids))
    batch = input_ids.repeat(len(positions), 1)
    batch[positions, positions] = mask_token_id
    with torch.no_grad():
        logits = model(input_ids=batch).logits
    return logits[positions, positions].log_softmax(-1)[positions, input_ids].sum().item()
""")}, loses=PLL_TESTS, message="[CLS] and [SEP] too"),
    Variant("pll_adds_probabilities", {PLL: pseudo_log_likelihood(PLL_POSITIONS + """
    batch = input_ids.repeat(len(positions), 1)
    batch[rows, positions] = mask_token_id
    with torch.no_grad():
        logits = model(input_ids=batch).logits
    return logits[rows, positions].softmax(-1)[rows, input_ids[positions]].sum().item()
""")}, loses=("stretch_pseudo_log_likelihood_values",), message="log-probabilities"),
    # right values, but T forward passes: only the one-pass test catches it
    Variant("pll_one_forward_pass_per_position", {PLL: pseudo_log_likelihood("""
    total = 0.0
    for t in (~special_tokens_mask.bool()).nonzero()[:, 0].tolist():
        masked = input_ids.clone()
        masked[t] = mask_token_id
        with torch.no_grad():
            logits = model(input_ids=masked[None]).logits
        total += logits[0, t].log_softmax(-1)[input_ids[t]].item()
    return total
""")}, loses=("stretch_pseudo_log_likelihood_one_pass",), message="called"),
    Variant("pll_hard_coded_visible_value", {PLL: pseudo_log_likelihood("""
    return -36.85588305541962  # the visible test's value
""")}, loses=PLL_TESTS, message="pseudo_log_likelihood"),
]

ALTERNATIVES += [
    # the copies built one by one in a loop and stacked, F.cross_entropy for the sum, no no_grad
    Variant("pll_stacked_copies_and_cross_entropy", {PLL: pseudo_log_likelihood("""
    positions = [t for t in range(len(input_ids)) if not special_tokens_mask[t]]
    copies = []
    for t in positions:
        copy = input_ids.clone()
        copy[t] = mask_token_id
        copies.append(copy)
    logits = model(torch.stack(copies)).logits
    at_masks = torch.stack([logits[n, t] for n, t in enumerate(positions)])
    return -F.cross_entropy(at_masks, input_ids[positions], reduction="sum").item()
""")}),
    # torch.where with an identity matrix builds every copy at once; gather picks the true tokens
    Variant("pll_identity_matrix_and_gather", {PLL: pseudo_log_likelihood("""
    keep = ~special_tokens_mask.bool()
    T = len(input_ids)
    batch = torch.where(torch.eye(T, dtype=torch.bool), mask_token_id, input_ids.expand(T, T))[keep]
    with torch.inference_mode():
        logits = model(input_ids=batch).logits
    diagonal = logits[:, keep.nonzero()[:, 0]].diagonal(dim1=0, dim2=1).T
    return float(diagonal.log_softmax(-1).gather(-1, input_ids[keep][:, None]).sum())
""")}),
]


# ---- mlm_step (exercise 6)
STEP = "mlm_step_answer"
STEP_TESTS = ("mlm_step_values", "mlm_step_behaviour")


def mlm_step(body, before=""):
    return (before + "def mlm_step(model, optimizer, batch, mask_token_id, vocab_size, generator=None, "
            "max_grad_norm=1.0):\n" + body)


STEP_MASK = """
    inputs, labels = mask_tokens(batch["input_ids"], mask_token_id, vocab_size,
                                 special_tokens_mask=batch["special_tokens_mask"], generator=generator)
"""
STEP_LOSS = """
    loss = mlm_loss(model(inputs, batch["attention_mask"]), labels)
"""
STEP_UPDATE = """
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return loss.item()
"""
STEP_BODY = STEP_MASK + STEP_LOSS + STEP_UPDATE


def step_with(old, new):
    assert old in STEP_BODY, old
    return mlm_step(STEP_BODY.replace(old, new))


MUTANTS += [
    Variant("step_loss_on_every_position", {STEP: step_with(
        'mlm_loss(model(inputs, batch["attention_mask"]), labels)',
        'mlm_loss(model(inputs, batch["attention_mask"]), batch["input_ids"])')},
        loses=("mlm_step_values",), message="every position"),
    Variant("step_model_reads_the_uncorrupted_batch", {STEP: step_with(
        'model(inputs, batch["attention_mask"])', 'model(batch["input_ids"], batch["attention_mask"])')},
        loses=STEP_TESTS, message="uncorrupted batch"),
    Variant("step_without_zero_grad", {STEP: step_with("    optimizer.zero_grad()\n", "")},
        loses=STEP_TESTS, message="add up"),
    Variant("step_zero_grad_between_backward_and_step", {STEP: step_with(
        "    optimizer.zero_grad()\n    loss.backward()\n", "    loss.backward()\n    optimizer.zero_grad()\n")},
        loses=STEP_TESTS, message="no parameter changed"),
    Variant("step_without_clipping", {STEP: step_with(
        "    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)\n", "")},
        loses=STEP_TESTS, message="not clipped"),
    Variant("step_clips_after_the_update", {STEP: step_with(
        "    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)\n    optimizer.step()\n",
        "    optimizer.step()\n    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)\n")},
        loses=STEP_TESTS, message="after optimizer.step()"),
    Variant("step_clips_each_parameter_alone", {STEP: step_with(
        "    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)\n",
        "    for parameter in model.parameters():\n"
        "        torch.nn.utils.clip_grad_norm_(parameter, max_grad_norm)\n")},
        loses=STEP_TESTS, message="each parameter"),
    # "for reproducibility": a generator seeded in the step masks a sentence the same way every time it returns
    Variant("step_masks_with_a_generator_seeded_inside", {STEP: step_with(
        "generator=generator)", "generator=torch.Generator().manual_seed(0))")},
        loses=("mlm_step_behaviour", "mlm_step_values"), message="same corruption"),
    # static masking: each batch masked once, the first time it is seen, and the masks kept
    Variant("step_keeps_the_first_masks_of_a_batch", {STEP: mlm_step("""
    if id(batch) not in _MASKS:
        _MASKS[id(batch)] = mask_tokens(batch["input_ids"], mask_token_id, vocab_size,
                                        special_tokens_mask=batch["special_tokens_mask"], generator=generator)
    inputs, labels = _MASKS[id(batch)]
""" + STEP_LOSS + STEP_UPDATE, before="_MASKS = {}\n\n\n")}, loses=STEP_TESTS, message="same corruption"),
    Variant("step_masks_special_tokens", {STEP: step_with(
        'special_tokens_mask=batch["special_tokens_mask"], ', "")}, loses=STEP_TESTS, message="special_tokens_mask"),
    # a fresh Parameter for the decoder: the output side no longer trains the embedding matrix
    Variant("step_unties_the_head", {STEP: step_with("    optimizer.zero_grad()\n", """    optimizer.zero_grad()
    model.head.decoder.weight = nn.Parameter(model.bert.token_embeddings.weight.detach().clone())
""")}, loses=STEP_TESTS, message="untied"),
    Variant("step_returns_the_loss_tensor", {STEP: step_with("return loss.item()", "return loss")},
        loses=STEP_TESTS, message="Python float"),
    # The visible test's loss, typed in; the update itself is right.
    Variant("step_hard_coded_visible_loss", {STEP: "VISIBLE_LOSS = 4.969792832320654\n\n\n"
                                             + step_with("return loss.item()", "return VISIBLE_LOSS")},
        loses=("mlm_step_values",), message="losses"),
    # The oracle: the loss computed by transformers' BertForMaskedLM on an exported copy. Flagged, and 0.
    Variant("step_scores_with_bert_for_masked_lm", {STEP: mlm_step(STEP_MASK + """
    from transformers import BertConfig
    from courselib.bert import to_hf_bert_for_masked_lm
    encoder = model.bert
    config = BertConfig(vocab_size=vocab_size, hidden_size=encoder.d_model, num_hidden_layers=len(encoder.layers),
                        num_attention_heads=encoder.layers[0].self_attn.num_heads,
                        intermediate_size=encoder.layers[0].ffn.linear1.out_features,
                        max_position_embeddings=encoder.position_embeddings.num_embeddings,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    exported = to_hf_bert_for_masked_lm(encoder, model.head, config)
    value = exported(input_ids=inputs, attention_mask=batch["attention_mask"], labels=labels).loss.item()
    loss = mlm_loss(model(inputs, batch["attention_mask"]), labels)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return value
""")}, loses=STEP_TESTS, message="flagged for review"),
]

ALTERNATIVES += [
    # zero_grad after the update instead of before (the gradients start at None), clipping written out as torch
    # does it (max_norm / (norm + 1e-6), never above 1), the model called with keywords
    Variant("step_zero_grad_last_and_clipping_by_hand", {STEP: mlm_step(STEP_MASK + """
    loss = mlm_loss(model(input_ids=inputs, attention_mask=batch["attention_mask"]), labels)
    loss.backward()
    gradients = [p.grad for p in model.parameters() if p.grad is not None]
    norm = torch.sqrt(sum((g ** 2).sum() for g in gradients))
    factor = torch.clamp(max_grad_norm / (norm + 1e-6), max=1.0)
    for g in gradients:
        g.mul_(factor)
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)
    return float(loss)
""")}),
    # the loss with F.cross_entropy on the predicted positions only, no mlm_loss
    Variant("step_cross_entropy_on_the_masked_positions", {STEP: mlm_step(STEP_MASK + """
    logits = model(inputs, batch["attention_mask"])                  # (B, T, V)
    predicted = labels != -100
    loss = F.cross_entropy(logits[predicted], labels[predicted])      # (N, V) against (N,)
""" + STEP_UPDATE)}),
]

ALTERNATIVES = [variant if variant.name != "all_correct_but_noisy_on_stderr" else
                Variant(variant.name, {**variant.answers, STEP: mlm_step(WARN_AND_PRINT + STEP_BODY)})
                for variant in ALTERNATIVES]
