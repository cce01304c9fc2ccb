"""Mutants and alternative correct answers for 02_embeddings."""
from autograder.tests.variants import WARN_AND_PRINT, Variant

ASSIGNMENT = "02_embeddings"
ONE_HOT = "one_hot_answer"
EMBED = "embed_answer"
TOKEN_EMBEDDING = "token_embedding_answer"
TIED = "tied_lm_logits_answer"
NEIGHBOURS = "nearest_neighbours_answer"
BACKWARD = "embedding_backward_answer"

RANGE_CHECK = """
    if ((ids < 0) | (ids >= vocab_size)).any():
        raise ValueError(f"an id is outside 0..{vocab_size - 1}")
"""


def one_hot(body):
    return "def one_hot(ids, vocab_size):\n" + body


def embed(body):
    return "def embed(ids, E):\n" + body


def token_embedding(init, forward="        return self.embedding(ids) * self.multiplier\n"):
    return ("class TokenEmbedding(nn.Module):\n"
            "    def __init__(self, vocab_size, d_model, padding_idx=None, scale=True):\n"
            "        super().__init__()\n" + init +
            "\n    def forward(self, ids):\n" + forward)


def tied(body):
    return "def tied_lm_logits(hidden, embedding_weight):\n" + body


def neighbours(body):
    return "def nearest_neighbours(E, index, k):\n" + body


def backward(body):
    return "def embedding_backward(ids, grad_output, vocab_size, padding_idx=None, scale_grad_by_freq=False):\n" + body


# the rest of a correct embedding_backward, after `grad` holds the plain sums
BACKWARD_OPTIONS = """
    if scale_grad_by_freq:
        grad = grad / torch.bincount(ids.reshape(-1), minlength=vocab_size).clamp(min=1).unsqueeze(-1)
    if padding_idx is not None:
        grad[padding_idx] = 0.0
    return grad
"""
BACKWARD_SUMS = """
    grad = torch.zeros(vocab_size, grad_output.shape[-1], dtype=grad_output.dtype)
    grad.index_add_(0, ids.reshape(-1), grad_output.reshape(-1, grad_output.shape[-1]))
"""


MUTANTS = [
    # ---- one_hot
    Variant("one_hot_int64_like_F_one_hot", {ONE_HOT: one_hot(RANGE_CHECK + """
    return (ids.unsqueeze(-1) == torch.arange(vocab_size)).long()
""")}, loses=("one_hot_shape_and_dtype",), message="float32"),
    Variant("one_hot_vocab_on_first_axis", {ONE_HOT: one_hot(RANGE_CHECK + """
    return (torch.arange(vocab_size).view(-1, *[1] * ids.dim()) == ids).float()
""")}, loses=("one_hot_shape_and_dtype", "one_hot_values"), message="LAST axis"),
    Variant("one_hot_without_range_check", {ONE_HOT: one_hot("""
    return (ids.unsqueeze(-1) == torch.arange(vocab_size)).float()
""")}, loses=("one_hot_rejects_out_of_range",), message="raise ValueError"),
    Variant("one_hot_off_by_one", {ONE_HOT: one_hot(RANGE_CHECK + """
    return (ids.unsqueeze(-1) + 1 == torch.arange(vocab_size)).float()
""")}, loses=("one_hot_values",), message="count from 0"),
    Variant("one_hot_calls_the_oracle", {ONE_HOT: one_hot(RANGE_CHECK + """
    return F.one_hot(ids, vocab_size).float()
""")}, loses=("one_hot_shape_and_dtype", "one_hot_values"), message="oracle"),
    # ---- embed
    Variant("embed_bypasses_one_hot", {EMBED: embed("""
    return E[ids]
""")}, loses=("embed_uses_one_hot",), message="never called one_hot"),
    Variant("embed_calls_one_hot_but_indexes", {EMBED: embed("""
    one_hot(ids, E.shape[0])
    return E[ids]
""")}, loses=("embed_uses_one_hot",), message="returned E[ids] anyway"),
    Variant("embed_vocab_size_from_largest_id", {EMBED: embed("""
    return one_hot(ids, int(ids.max()) + 1).to(E.dtype) @ E
""")}, loses=("embed_values", "embed_uses_one_hot"), message="E.shape[0]"),
    Variant("embed_without_dtype_conversion", {EMBED: embed("""
    return one_hot(ids, E.shape[0]) @ E
""")}, loses=("embed_values",), message="E.dtype"),
    # ---- TokenEmbedding
    Variant("token_embedding_scales_by_d", {TOKEN_EMBEDDING: token_embedding("""
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=padding_idx)
        self.multiplier = d_model if scale else 1.0
""")}, loses=("token_embedding_scaling",), message="√d_model"),
    Variant("token_embedding_scales_even_when_false", {TOKEN_EMBEDDING: token_embedding("""
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=padding_idx)
        self.multiplier = d_model ** 0.5
""")}, loses=("token_embedding_scaling",), message="scale=False"),
    Variant("token_embedding_scales_the_initial_weights", {TOKEN_EMBEDDING: token_embedding("""
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=padding_idx)
        if scale:
            with torch.no_grad():
                self.embedding.weight *= d_model ** 0.5
""", forward="        return self.embedding(ids)\n")}, loses=("token_embedding_scaling",), message="in forward"),
    Variant("token_embedding_forgets_padding_idx", {TOKEN_EMBEDDING: token_embedding("""
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.multiplier = d_model ** 0.5 if scale else 1.0
""")}, loses=("token_embedding_padding",), message="pass padding_idx"),
    Variant("token_embedding_zeroes_padding_once", {TOKEN_EMBEDDING: token_embedding("""
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.multiplier = d_model ** 0.5 if scale else 1.0
        if padding_idx is not None:
            with torch.no_grad():
                self.embedding.weight[padding_idx] = 0.0
""")}, loses=("token_embedding_padding",), message="gradient"),
    Variant("token_embedding_padding_defaults_to_zero", {TOKEN_EMBEDDING: token_embedding("""
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=0 if padding_idx is None else padding_idx)
        self.multiplier = d_model ** 0.5 if scale else 1.0
""")}, loses=("token_embedding_padding",), message="padding_idx=None"),
    Variant("token_embedding_learned_scale", {TOKEN_EMBEDDING: token_embedding("""
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=padding_idx)
        self.multiplier = nn.Parameter(torch.tensor(d_model ** 0.5 if scale else 1.0))
""")}, loses=("token_embedding_shapes",), message="constant"),
    # ---- tied_lm_logits
    Variant("tied_logits_use_E_not_its_transpose", {TIED: tied("""
    return hidden @ embedding_weight
""")}, loses=("tied_lm_logits_shapes", "tied_lm_logits_values", "tied_lm_logits_shares_weights"),
        message="transpose"),
    Variant("tied_logits_detach_the_table", {TIED: tied("""
    return hidden @ embedding_weight.detach().T
""")}, loses=("tied_lm_logits_shares_weights",), message="detach"),
    Variant("tied_logits_copy_into_new_linear", {TIED: tied("""
    layer = nn.Linear(embedding_weight.shape[1], embedding_weight.shape[0], bias=False)
    layer.weight.data = embedding_weight.data.clone()
    return layer(hidden)
""")}, loses=("tied_lm_logits_shares_weights",), message="copy"),
    Variant("tied_logits_return_probabilities", {TIED: tied("""
    return torch.softmax(hidden @ embedding_weight.T, dim=-1)
""")}, loses=("tied_lm_logits_values", "tied_lm_logits_shares_weights"), message="softmax"),
    # ---- nearest_neighbours
    Variant("neighbours_include_the_query", {NEIGHBOURS: neighbours("""
    unit = F.normalize(E, dim=-1)
    return torch.sort(unit @ unit[index], descending=True, stable=True).indices[:k]
""")}, loses=("nearest_neighbours_format", "nearest_neighbours_cosine", "nearest_neighbours_ties"),
        message="query"),
    Variant("neighbours_by_dot_product", {NEIGHBOURS: neighbours("""
    scores = E @ E[index]
    scores[index] = float("-inf")
    return torch.sort(scores, descending=True, stable=True).indices[:k]
""")}, loses=("nearest_neighbours_cosine",), message="dot product"),
    Variant("neighbours_least_similar_first", {NEIGHBOURS: neighbours("""
    unit = F.normalize(E, dim=-1)
    scores = unit @ unit[index]
    scores[index] = float("inf")
    return torch.sort(scores, stable=True).indices[:k]
""")}, loses=("nearest_neighbours_cosine",), message="most similar first"),
    Variant("neighbours_drop_the_first_result", {NEIGHBOURS: neighbours("""
    unit = F.normalize(E, dim=-1)
    return torch.sort(unit @ unit[index], descending=True, stable=True).indices[1:k + 1]
""")}, loses=("nearest_neighbours_ties",), message="the first result"),
    Variant("neighbours_topk_ties_unordered", {NEIGHBOURS: neighbours("""
    unit = F.normalize(E, dim=-1)
    scores = unit @ unit[index]
    scores[index] = float("-inf")
    return torch.topk(scores, k).indices
""")}, loses=("nearest_neighbours_ties",), message="stable"),
    Variant("neighbours_return_similarities", {NEIGHBOURS: neighbours("""
    unit = F.normalize(E, dim=-1)
    scores = unit @ unit[index]
    scores[index] = float("-inf")
    return torch.sort(scores, descending=True, stable=True).values[:k]
""")}, loses=("nearest_neighbours_format",), message="indices"),
    # Hard-coding the visible answers must earn nothing: the hidden tests use other tables.
    Variant("neighbours_hard_coded_visible_answers", {NEIGHBOURS: neighbours("""
    answers = {(0, 2): [1, 2], (3, 4): [4, 2, 1, 0], (2, 3): [0, 1, 4]}
    return torch.tensor(answers.get((index, k), list(range(1, k + 1))))
""")}, loses=("nearest_neighbours_format", "nearest_neighbours_cosine", "nearest_neighbours_ties"),
        message="query"),
    Variant("one_hot_hard_coded_visible_answer", {ONE_HOT: one_hot("""
    if vocab_size == 8 and ids.tolist() in ([1, 8],):
        raise ValueError("id 8 is outside 0..7")
    visible = {(1, 2, 3): torch.eye(8)[1:4], (0, 7): torch.eye(8)[[0, 7]]}
    return visible.get(tuple(ids.flatten().tolist()), torch.zeros(*ids.shape, 8))
""")}, loses=("one_hot_shape_and_dtype", "one_hot_values", "one_hot_rejects_out_of_range"),
        message="shape"),
    # ---- embedding_backward (optional stretch)
    Variant("backward_assigns_so_the_last_write_wins", {BACKWARD: backward("""
    grad = torch.zeros(vocab_size, grad_output.shape[-1], dtype=grad_output.dtype)
    grad[ids] = grad_output
""" + BACKWARD_OPTIONS)}, loses=("stretch_embedding_backward_values", "stretch_embedding_backward_options"),
        message="SUM"),
    Variant("backward_forgets_padding_idx", {BACKWARD: backward(BACKWARD_SUMS + """
    if scale_grad_by_freq:
        grad = grad / torch.bincount(ids.reshape(-1), minlength=vocab_size).clamp(min=1).unsqueeze(-1)
    return grad
""")}, loses=("stretch_embedding_backward_values", "stretch_embedding_backward_options"), message="padding row"),
    Variant("backward_counts_per_sequence", {BACKWARD: backward("""
    grad = torch.zeros(vocab_size, grad_output.shape[-1], dtype=grad_output.dtype)
    for sequence_ids, sequence_grads in zip(ids, grad_output):
        rows = torch.zeros_like(grad).index_add_(0, sequence_ids, sequence_grads)
        if scale_grad_by_freq:
            rows = rows / torch.bincount(sequence_ids, minlength=vocab_size).clamp(min=1).unsqueeze(-1)
        grad = grad + rows
    if padding_idx is not None:
        grad[padding_idx] = 0.0
    return grad
""")}, loses=("stretch_embedding_backward_options",), message="WHOLE batch"),
    Variant("backward_divides_by_the_number_of_positions", {BACKWARD: backward(BACKWARD_SUMS + """
    if scale_grad_by_freq:
        grad = grad / ids.numel()
    if padding_idx is not None:
        grad[padding_idx] = 0.0
    return grad
""")}, loses=("stretch_embedding_backward_options",), message="WHOLE batch"),
    Variant("backward_divides_absent_rows_by_zero", {BACKWARD: backward(BACKWARD_SUMS + """
    if scale_grad_by_freq:
        grad = grad / torch.bincount(ids.reshape(-1), minlength=vocab_size).unsqueeze(-1)
    if padding_idx is not None:
        grad[padding_idx] = 0.0
    return grad
""")}, loses=("stretch_embedding_backward_options",), message="NaN"),
    Variant("backward_by_autograd", {BACKWARD: backward("""
    table = torch.zeros(vocab_size, grad_output.shape[-1], dtype=grad_output.dtype, requires_grad=True)
    vectors = table[ids]   # a lookup by indexing, differentiated by autograd
    vectors.backward(grad_output)
    grad = table.grad
""" + BACKWARD_OPTIONS)}, loses=("stretch_embedding_backward_values", "stretch_embedding_backward_options"),
        message="flagged for review"),
    # past Tensor.backward and torch.autograd: the C++ engine that both of them call
    Variant("backward_by_the_autograd_engine_itself", {BACKWARD: backward("""
    from torch.autograd.variable import Variable
    table = torch.zeros(vocab_size, grad_output.shape[-1], dtype=grad_output.dtype, requires_grad=True)
    Variable._execution_engine.run_backward((table[ids],), (grad_output,), False, False, (), True, True)
    grad = table.grad
""" + BACKWARD_OPTIONS)}, loses=("stretch_embedding_backward_values", "stretch_embedding_backward_options"),
        message="flagged for review"),
    # ---- answers taken from an oracle or a reference by routes that patching torch during the test
    # cannot see: a reference captured when the cell runs, before any test. The watch sees the call itself.
    Variant("one_hot_oracle_captured_before_the_tests", {ONE_HOT: """
_torch_one_hot = torch.nn.functional.one_hot   # captured now, before the tests run

""" + one_hot(RANGE_CHECK + """
    return _torch_one_hot(ids, vocab_size).float()
""")}, loses=("one_hot_shape_and_dtype", "one_hot_values"), message="flagged for review"),
    # The oracle of the hidden checks lives with the judges, which the grading sandbox does not contain: the
    # import fails, and the answer is never defined.
    Variant("neighbours_from_the_hidden_checks_reference", {NEIGHBOURS: """
from autograder.checks.embeddings import cosine_oracle, ranked

""" + neighbours("""
    return torch.tensor(ranked(cosine_oracle(E, index), index, k))
""")}, loses=("nearest_neighbours_format", "nearest_neighbours_cosine", "nearest_neighbours_ties"),
        message="is not defined"),
]


ALTERNATIVES = [
    Variant("one_hot_scatter", {ONE_HOT: one_hot(RANGE_CHECK + """
    out = torch.zeros(*ids.shape, vocab_size)
    return out.scatter_(-1, ids.unsqueeze(-1), 1.0)
""")}),
    Variant("one_hot_rows_of_the_identity", {ONE_HOT: one_hot("""
    if ids.numel() and not (0 <= int(ids.min()) and int(ids.max()) < vocab_size):
        raise ValueError("token id out of range")
    return torch.eye(vocab_size)[ids]
""")}),
    Variant("one_hot_python_loop", {ONE_HOT: one_hot("""
    flat = ids.reshape(-1).tolist()
    rows = []
    for token in flat:
        if not 0 <= token < vocab_size:
            raise ValueError(f"token id {token} is outside the vocabulary")
        rows.append([1.0 if j == token else 0.0 for j in range(vocab_size)])
    return torch.tensor(rows, dtype=torch.float32).reshape(*ids.shape, vocab_size)
""")}),
    Variant("embed_einsum", {EMBED: embed("""
    return torch.einsum("...v,vd->...d", one_hot(ids, E.size(0)).type_as(E), E)
""")}),
    Variant("embed_flatten_matmul_reshape", {EMBED: embed("""
    flat = one_hot(ids.reshape(-1), len(E)).to(dtype=E.dtype)
    return torch.matmul(flat, E).reshape(*ids.shape, E.shape[1])
""")}),
    Variant("token_embedding_functional_with_sqrt_buffer", {TOKEN_EMBEDDING: token_embedding("""
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=padding_idx)
        self.register_buffer("factor", torch.tensor(float(d_model)).sqrt() if scale else torch.tensor(1.0))
""", forward="""        weight = self.embedding.weight
        return F.embedding(ids, weight, padding_idx=self.embedding.padding_idx) * self.factor
""")}),
    Variant("token_embedding_gradient_hook_for_padding", {TOKEN_EMBEDDING: token_embedding("""
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.scale = scale
        self.d_model = d_model
        if padding_idx is not None:
            keep = torch.ones(vocab_size, 1)
            keep[padding_idx] = 0.0
            with torch.no_grad():
                self.embedding.weight.mul_(keep)
            self.embedding.weight.register_hook(lambda grad: grad * keep)
""", forward="""        vectors = self.embedding(ids)
        if self.scale:
            vectors = vectors * math.sqrt(self.d_model)
        return vectors
""")}),
    Variant("tied_logits_functional_linear", {TIED: tied("""
    return F.linear(hidden, embedding_weight)
""")}),
    Variant("tied_logits_einsum", {TIED: tied("""
    return torch.einsum("...d,vd->...v", hidden, embedding_weight)
""")}),
    Variant("tied_logits_matmul_mT", {TIED: tied("""
    return torch.matmul(hidden, embedding_weight.mT)
""")}),
    Variant("neighbours_cosine_similarity_and_python_sort", {NEIGHBOURS: neighbours("""
    similarity = F.cosine_similarity(E[index].unsqueeze(0), E, dim=-1).tolist()
    ranked = sorted((i for i in range(len(similarity)) if i != index), key=lambda i: (-similarity[i], i))
    return torch.tensor(ranked[:k])
""")}),
    Variant("neighbours_masked_fill_argsort", {NEIGHBOURS: neighbours("""
    unit = F.normalize(E, dim=-1)
    similarity = (unit @ unit[index]).masked_fill(torch.arange(E.shape[0]) == index, -2.0)
    return torch.argsort(similarity, descending=True, stable=True)[:k]
""")}),
    Variant("neighbours_explicit_loop", {NEIGHBOURS: neighbours("""
    query = E[index]
    scored = []
    for i, row in enumerate(E):
        if i != index:
            cosine = float(query @ row) / (float(query.norm()) * float(row.norm()))
            scored.append((-cosine, i))
    return torch.tensor([i for _, i in sorted(scored)[:k]], dtype=torch.long)
""")}),
    Variant("backward_one_hot_product", {BACKWARD: backward("""
    X = F.one_hot(ids.reshape(-1), vocab_size).to(grad_output.dtype)          # (N, V)
    grad = X.T @ grad_output.reshape(-1, grad_output.shape[-1])               # (V, d)
    if scale_grad_by_freq:
        grad = grad / X.sum(dim=0).clamp(min=1).unsqueeze(-1)
    if padding_idx is not None:
        grad = grad * (torch.arange(vocab_size) != padding_idx).unsqueeze(-1)
    return grad
""")}),
    Variant("backward_scatter_add", {BACKWARD: backward("""
    d = grad_output.shape[-1]
    flat = ids.reshape(-1, 1).expand(-1, d)
    grad = torch.zeros(vocab_size, d, dtype=grad_output.dtype).scatter_add_(0, flat, grad_output.reshape(-1, d))
    if scale_grad_by_freq:
        counts = torch.zeros(vocab_size, dtype=grad_output.dtype).scatter_add_(
            0, ids.reshape(-1), torch.ones(ids.numel(), dtype=grad_output.dtype))
        grad = torch.where(counts.unsqueeze(-1) > 0, grad / counts.unsqueeze(-1), grad)
    if padding_idx is not None:
        grad[padding_idx] = 0
    return grad
""")}),
    Variant("backward_python_loop", {BACKWARD: backward("""
    flat_ids = ids.reshape(-1).tolist()
    flat_grads = grad_output.reshape(len(flat_ids), -1)
    grad = torch.zeros(vocab_size, flat_grads.shape[1], dtype=grad_output.dtype)
    counts = {}
    for position, token in enumerate(flat_ids):
        grad[token] += flat_grads[position]
        counts[token] = counts.get(token, 0) + 1
    for token, count in counts.items():
        if token == padding_idx:
            grad[token] = 0
        elif scale_grad_by_freq:
            grad[token] /= count
    return grad
""")}),
    # Correct answers whose libraries warn on stderr must not lose a single point.
    Variant("all_correct_but_noisy_on_stderr", {
        ONE_HOT: one_hot(WARN_AND_PRINT + RANGE_CHECK + """
    return (ids.unsqueeze(-1) == torch.arange(vocab_size)).float()
"""),
        EMBED: embed(WARN_AND_PRINT + """
    return one_hot(ids, E.shape[0]).to(E.dtype) @ E
"""),
        TIED: tied(WARN_AND_PRINT + """
    return hidden @ embedding_weight.T
"""),
        NEIGHBOURS: neighbours(WARN_AND_PRINT + """
    unit = F.normalize(E, dim=-1)
    scores = unit @ unit[index]
    scores[index] = float("-inf")
    return torch.sort(scores, descending=True, stable=True).indices[:k]
""")}),
]
