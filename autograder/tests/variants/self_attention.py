"""Mutants and alternative correct answers for 04_self_attention."""
from autograder.tests.variants import WARN_AND_PRINT, Variant

ASSIGNMENT = "04_self_attention"
BY_HAND = "self_attention_by_hand_answer"
SOFTMAX = "softmax_answer"
SDPA = "scaled_dot_product_attention_answer"
ONLINE = "online_attention_answer"
SOFTMAX_TESTS = ("softmax_matches_torch", "softmax_is_stable", "softmax_respects_dim")


def by_hand(body):
    return "def self_attention_by_hand(X, W_Q, W_K, W_V):\n" + body


def softmax(body):
    return "def softmax(x, dim=-1):\n" + body


def sdpa(body):
    return "def scaled_dot_product_attention(q, k, v, mask=None):\n" + body


def online(body):
    return "def online_attention(q, k, v, chunk_size):\n" + body


ONLINE_STATE = """
    scale = 1 / math.sqrt(q.shape[-1])
    m = torch.full((*q.shape[:-1], 1), float("-inf"), dtype=q.dtype)
    l = torch.zeros((*q.shape[:-1], 1), dtype=q.dtype)
    o = torch.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)
"""


STABLE_NUMPY_SOFTMAX = """
    scores = scores - scores.max(axis=-1, keepdims=True)
    S = np.exp(scores) / np.exp(scores).sum(axis=-1, keepdims=True)
"""

MUTANTS = [
    # ---- self_attention_by_hand
    Variant("by_hand_no_sqrt_scaling", {BY_HAND: by_hand("""
    Q, K, V = X @ W_Q, X @ W_K, X @ W_V
    scores = Q @ K.T""" + STABLE_NUMPY_SOFTMAX + """
    return Q, K, V, S, S @ V
""")}, loses=("self_attention_by_hand_values",), message="√d_k"),
    Variant("by_hand_softmax_over_columns", {BY_HAND: by_hand("""
    Q, K, V = X @ W_Q, X @ W_K, X @ W_V
    scores = Q @ K.T / np.sqrt(K.shape[1])
    scores = scores - scores.max(axis=0, keepdims=True)
    S = np.exp(scores) / np.exp(scores).sum(axis=0, keepdims=True)
    return Q, K, V, S, S @ V
""")}, loses=("self_attention_by_hand_values",), message="axis=1"),
    Variant("by_hand_unstable_softmax", {BY_HAND: by_hand("""
    Q, K, V = X @ W_Q, X @ W_K, X @ W_V
    scores = Q @ K.T / np.sqrt(K.shape[1])
    S = np.exp(scores) / np.exp(scores).sum(axis=1, keepdims=True)
    return Q, K, V, S, S @ V
""")}, loses=("self_attention_by_hand_is_stable",), message="overflow"),
    Variant("by_hand_scaled_by_width_of_X", {BY_HAND: by_hand("""
    Q, K, V = X @ W_Q, X @ W_K, X @ W_V
    scores = Q @ K.T / np.sqrt(X.shape[1])""" + STABLE_NUMPY_SOFTMAX + """
    return Q, K, V, S, S @ V
""")}, loses=("self_attention_by_hand_values",), message="width of Q and K"),
    Variant("by_hand_scaled_by_d_not_sqrt_d", {BY_HAND: by_hand("""
    Q, K, V = X @ W_Q, X @ W_K, X @ W_V
    scores = Q @ K.T / K.shape[1]""" + STABLE_NUMPY_SOFTMAX + """
    return Q, K, V, S, S @ V
""")}, loses=("self_attention_by_hand_values",), message="√d_k"),
    Variant("by_hand_weights_before_softmax", {BY_HAND: by_hand("""
    Q, K, V = X @ W_Q, X @ W_K, X @ W_V
    S = Q @ K.T / np.sqrt(K.shape[1])
    return Q, K, V, S, S @ V
""")}, loses=("self_attention_by_hand_values", "self_attention_by_hand_is_stable"), message="sum to 1"),
    # Hard-coding the visible worked example must earn nothing: every test has hidden random inputs.
    Variant("by_hand_hard_coded_worked_example", {BY_HAND: by_hand("""
    Q = np.array([[3, 1, 5, 4], [4, 5, 3, 2], [2, 4, 0, 0]])
    K = np.array([[1, 0, 0, 1], [6, 2, 4, 1], [5, 2, 4, 0]])
    V = np.array([[0, 6, 3, 0], [1, 6, 4, 4], [1, 2, 2, 4]])
    S = np.array([[8.96667933e-09, 9.70687761e-01, 2.93122305e-02],
                  [7.22295087e-10, 9.52574126e-01, 4.74258731e-02],
                  [9.02116571e-05, 7.30992629e-01, 2.68917160e-01]])
    return Q, K, V, S, S @ V
""")}, loses=("self_attention_by_hand_shapes", "self_attention_by_hand_values",
              "self_attention_by_hand_is_stable"), message="shape"),
    # ---- softmax
    Variant("softmax_unstable", {SOFTMAX: softmax("""
    return torch.exp(x) / torch.exp(x).sum(dim=dim, keepdim=True)
""")}, loses=("softmax_is_stable",), message="overflow"),
    Variant("softmax_ignores_dim", {SOFTMAX: softmax("""
    shifted = x - x.amax(dim=-1, keepdim=True)
    return torch.exp(shifted) / torch.exp(shifted).sum(dim=-1, keepdim=True)
""")}, loses=("softmax_respects_dim",), message="along dim"),
    Variant("softmax_calls_torch_softmax", {SOFTMAX: softmax("""
    return torch.softmax(x, dim=dim)
""")}, loses=("softmax_matches_torch",), message="oracle"),
    # ---- softmax taken from torch by routes that no reading of the source resolves and that hide from the
    # kernel's own watch: every one ends in libtorch's softmax, where the grader's breakpoint sees it from
    # outside the kernel (autograder/native_watch.py); where the kernel's watch refuses the call first, that
    # is the finding. Either way the tests fail and are flagged.
    *[Variant(f"softmax_taken_by_{name}", {SOFTMAX: code}, loses=SOFTMAX_TESTS, message="flagged for review")
      for name, code in (
        ("getattr_with_a_constant", softmax("""
    with torch._C.DisableTorchFunction():
        return getattr(torch._C._VariableFunctions, "softmax")(x, dim)
""")),
        ("exec_through_an_alias", softmax("""
    run, scope = exec, {"x": x, "dim": dim}
    run("import torch\\nout = torch._C._VariableFunctions.softmax(x, dim)", scope)
    return scope["out"]
""")),
        ("functools_reduce_of_getattr", softmax("""
    import functools
    return functools.reduce(getattr, ["_C", "_VariableFunctions", "softmax"], torch)(x, dim)
""")),
        ("a_module_written_to_disk", softmax("""
    import importlib.util, pathlib, tempfile
    path = pathlib.Path(tempfile.mkdtemp()) / "helper_mod.py"
    path.write_text("import torch\\ndef f(x, d):\\n    return torch._C._VariableFunctions.softmax(x, d)\\n")
    spec = importlib.util.spec_from_file_location("helper_mod", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.f(x, dim)
""")),
        ("a_pickle", softmax("""
    import io, pickle
    class Call:
        def __reduce__(self):
            return (torch._C._VariableFunctions.softmax, (x, dim))
    return pickle.loads(pickle.dumps(Call()))
""")),
        ("a_tensor_subclass_built_with_type", softmax("""
    Fast = type("Fast", (torch.Tensor,), {})
    return torch._C._VariableFunctions.softmax(x.as_subclass(Fast), dim).as_subclass(torch.Tensor)
""")),
        ("a_decorator_and_a_metaclass", softmax("""
    def through(f):
        return lambda *a: getattr([torch._C._VariableFunctions][0], "soft" + "max")(*a)
    class Meta(type):
        def __call__(cls, *a):
            return through(None)(*a)
    class Softmax(metaclass=Meta):
        pass
    return Softmax(x, dim)
""")),
        ("the_watch_switched_off", softmax("""
    import functools, sys
    saved = sys.getprofile()
    functools.partial(sys.setprofile, None)()
    try:
        with torch._C.DisableTorchFunction():
            return getattr(torch._C._VariableFunctions, "soft" + "max")(x, dim)
    finally:
        functools.partial(sys.setprofile, saved)()
""")),
      )],
    Variant("softmax_modifies_input_in_place", {SOFTMAX: softmax("""
    x -= x.amax(dim=dim, keepdim=True)
    return torch.exp(x) / torch.exp(x).sum(dim=dim, keepdim=True)
""")}, loses=("softmax_matches_torch",), message="in place"),
    Variant("softmax_normalises_x_not_exp", {SOFTMAX: softmax("""
    return x / x.sum(dim=dim, keepdim=True)
""")}, loses=("softmax_matches_torch", "softmax_is_stable"), message="Divide exp(x)"),
    # ---- scaled_dot_product_attention
    Variant("sdpa_no_sqrt_scaling", {SDPA: sdpa("""
    scores = q @ k.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights
""")}, loses=("sdpa_values_match_torch", "sdpa_mask"), message="√d_k"),
    Variant("sdpa_softmax_over_queries", {SDPA: sdpa("""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-2)
    return weights @ v, weights
""")}, loses=("sdpa_values_match_torch", "sdpa_weights_are_probabilities"), message="sum to 1"),
    Variant("sdpa_mask_polarity_inverted", {SDPA: sdpa("""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights
""")}, loses=("sdpa_mask",), message="True means"),
    Variant("sdpa_mask_zeroed_after_softmax", {SDPA: sdpa("""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights * mask
    return weights @ v, weights
""")}, loses=("sdpa_mask",), message=""),
    Variant("sdpa_weights_before_softmax", {SDPA: sdpa("""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e9)
    return torch.softmax(scores, dim=-1) @ v, scores
""")}, loses=("sdpa_values_match_torch", "sdpa_weights_are_probabilities"), message="sum to 1"),
    Variant("sdpa_k_dot_T_on_batches", {SDPA: sdpa("""
    scores = q @ k.T / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights
""")}, loses=("sdpa_shapes", "sdpa_values_match_torch"), message="transpose"),
    Variant("sdpa_transposes_batch_dims", {SDPA: sdpa("""
    scores = q @ k.transpose(0, 1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights
""")}, loses=("sdpa_shapes", "sdpa_values_match_torch"), message="transpose"),
    Variant("sdpa_calls_the_oracle", {SDPA: sdpa("""
    scale = 1 / math.sqrt(q.shape[-1])
    weights = torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), weights
""")}, loses=("sdpa_shapes", "sdpa_values_match_torch"), message="oracle"),
    # ---- online_attention (optional stretch)
    Variant("online_forgets_to_rescale_when_the_max_changes", {ONLINE: online(ONLINE_STATE + """
    for start in range(0, k.shape[-2], chunk_size):
        s = q @ k[..., start:start + chunk_size, :].mT * scale
        new_m = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        p = torch.exp(s - new_m)
        l = l + p.sum(dim=-1, keepdim=True)
        o = o + p @ v[..., start:start + chunk_size, :]
        m = new_m
    return o / l
""")}, loses=("stretch_online_attention_values",), message="exp(m - m')"),
    Variant("online_drops_the_last_short_chunk", {ONLINE: online(ONLINE_STATE + """
    for start in range(0, k.shape[-2] - chunk_size + 1, chunk_size):
        s = q @ k[..., start:start + chunk_size, :].mT * scale
        new_m = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        p, r = torch.exp(s - new_m), torch.exp(m - new_m)
        l = l * r + p.sum(dim=-1, keepdim=True)
        o = o * r + p @ v[..., start:start + chunk_size, :]
        m = new_m
    return o / l
""")}, loses=("stretch_online_attention_values",), message="shorter chunk"),
    Variant("online_builds_the_full_score_matrix", {ONLINE: online("""
    scores = q @ k.mT / math.sqrt(q.shape[-1])
    weights = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    return (weights / weights.sum(dim=-1, keepdim=True)) @ v
""")}, loses=("stretch_online_attention_memory",), message="one chunk of keys at a time"),
    Variant("online_calls_the_oracle_captured_early", {ONLINE: """\
import torch
_attention = torch.nn.functional.scaled_dot_product_attention

def online_attention(q, k, v, chunk_size):
    return _attention(q, k, v)
"""}, loses=("stretch_online_attention_values", "stretch_online_attention_memory"), message="flagged for review"),
]


ALTERNATIVES = [
    Variant("by_hand_explicit_loops", {BY_HAND: by_hand("""
    n, d_k = X.shape[0], W_Q.shape[1]
    Q = np.array([[sum(X[i, m] * W_Q[m, j] for m in range(X.shape[1])) for j in range(d_k)] for i in range(n)])
    K = np.array([[sum(X[i, m] * W_K[m, j] for m in range(X.shape[1])) for j in range(d_k)] for i in range(n)])
    V = np.array([[sum(X[i, m] * W_V[m, j] for m in range(X.shape[1])) for j in range(W_V.shape[1])]
                  for i in range(n)])
    S = np.zeros((n, n))
    for i in range(n):
        row = [sum(Q[i, c] * K[j, c] for c in range(d_k)) / d_k ** 0.5 for j in range(n)]
        top = max(row)
        exps = [math.exp(r - top) for r in row]
        S[i] = [e / sum(exps) for e in exps]
    A = np.array([[sum(S[i, j] * V[j, c] for j in range(n)) for c in range(V.shape[1])] for i in range(n)])
    return Q, K, V, S, A
""")}),
    Variant("by_hand_einsum_logsumexp", {BY_HAND: by_hand("""
    Q = np.einsum("nd,dk->nk", X, W_Q)
    K = np.einsum("nd,dk->nk", X, W_K)
    V = np.einsum("nd,dv->nv", X, W_V)
    scores = np.einsum("qk,tk->qt", Q, K) / np.sqrt(Q.shape[-1])
    top = scores.max(axis=1, keepdims=True)
    log_norm = top + np.log(np.exp(scores - top).sum(axis=1, keepdims=True))
    S = np.exp(scores - log_norm)
    return Q, K, V, S, np.einsum("qt,tv->qv", S, V)
""")}),
    Variant("softmax_logsumexp", {SOFTMAX: softmax("""
    return torch.exp(x - torch.logsumexp(x, dim=dim, keepdim=True))
""")}),
    Variant("softmax_movedim_loop", {SOFTMAX: softmax("""
    moved = x.movedim(dim, -1)
    rows = moved.reshape(-1, moved.shape[-1])
    out = torch.empty_like(rows)
    for i, row in enumerate(rows):
        e = torch.exp(row - row.max())
        out[i] = e / e.sum()
    return out.reshape(moved.shape).movedim(-1, dim)
""")}),
    Variant("sdpa_einsum_where", {SDPA: sdpa("""
    scores = torch.einsum("...qd,...kd->...qk", q, k) * q.shape[-1] ** -0.5
    if mask is not None:
        scores = torch.where(mask, scores, torch.tensor(float("-inf"), dtype=scores.dtype))
    weights = softmax(scores, dim=-1)
    return torch.einsum("...qk,...kv->...qv", weights, v), weights
""")}),
    Variant("sdpa_mT_additive_mask", {SDPA: sdpa("""
    scores = torch.matmul(q, k.mT) / math.sqrt(k.size(-1))
    if mask is not None:
        scores = scores + torch.zeros_like(scores).masked_fill(~mask, -1e30)
    weights = torch.softmax(scores, dim=-1)
    return torch.matmul(weights, v), weights
""")}),
    # A correct answer whose libraries warn on stderr must not lose a single point.
    Variant("all_correct_but_noisy_on_stderr", {
        BY_HAND: by_hand(WARN_AND_PRINT + """
    Q, K, V = X @ W_Q, X @ W_K, X @ W_V
    scores = Q @ K.T / np.sqrt(K.shape[-1])""" + STABLE_NUMPY_SOFTMAX + """
    return Q, K, V, S, S @ V
"""),
        SOFTMAX: softmax(WARN_AND_PRINT + """
    return torch.exp(x - torch.logsumexp(x, dim=dim, keepdim=True))
"""),
        SDPA: sdpa(WARN_AND_PRINT + """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights
""")}),
    Variant("online_two_passes_max_then_sums", {ONLINE: online("""
    scale = q.shape[-1] ** -0.5
    chunks = range(0, k.shape[-2], chunk_size)
    m = torch.stack([(q @ k[..., i:i + chunk_size, :].mT * scale).amax(dim=-1) for i in chunks]).amax(dim=0)[..., None]
    l, o = 0, 0
    for i in chunks:
        p = torch.exp(q @ k[..., i:i + chunk_size, :].mT * scale - m)
        l = l + p.sum(dim=-1, keepdim=True)
        o = o + p @ v[..., i:i + chunk_size, :]
    return o / l
""")}),
    Variant("online_logsumexp_state", {ONLINE: online("""
    scale = 1 / math.sqrt(q.shape[-1])
    log_l = torch.full((*q.shape[:-1], 1), float("-inf"), dtype=q.dtype)
    o = torch.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)
    for start in range(0, k.shape[-2], chunk_size):
        s = q @ k[..., start:start + chunk_size, :].transpose(-2, -1) * scale
        chunk_log_l = torch.logsumexp(s, dim=-1, keepdim=True)
        new_log_l = torch.logaddexp(log_l, chunk_log_l)
        o = o * torch.exp(log_l - new_log_l) + torch.exp(s - new_log_l) @ v[..., start:start + chunk_size, :]
        log_l = new_log_l
    return o
""")}),
]
