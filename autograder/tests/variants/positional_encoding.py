"""Mutants and alternative correct answers for 03_positional_encoding."""
from autograder.tests.variants import WARN_AND_PRINT, Variant

ASSIGNMENT = "03_positional_encoding"
PE = "sinusoidal_positional_encoding_answer"
SHIFT = "relative_shift_matrix_answer"
LEARNED = "learned_positional_embedding_answer"
ROPE = "apply_rope_answer"
LLAMA3 = "llama3_inv_freq_answer"


def pe(body):
    return "def sinusoidal_positional_encoding(num_positions, d_model, base=10000.0):\n" + body


def shift(body):
    return "def relative_shift_matrix(k, d_model, base=10000.0):\n" + body


def rope(body):
    return "def apply_rope(q, k, positions=None, base=10000.0):\n" + body


def llama3(body):
    return ("def llama3_inv_freq(head_dim, base, factor, low_freq_factor, high_freq_factor, original_max_position):\n"
            + body)


def learned(init_body, forward_body, base_class="nn.Module"):
    return (f"class LearnedPositionalEmbedding({base_class}):\n"
            "    def __init__(self, max_positions, d_model):\n" + init_body +
            "\n    def forward(self, ids_or_length):\n" + forward_body)


ODD_CHECK = """
    if d_model % 2:
        raise ValueError(f"d_model must be even, got {d_model}")
"""

# The pieces of a correct encoding, reused so that each mutant differs from it by one bug.
ANGLES = """
    t = torch.arange(num_positions, dtype=torch.float32)[:, None]
    angles = t * base ** (-2 * torch.arange(d_model // 2, dtype=torch.float32) / d_model)
"""
INTERLEAVE = """
    out = torch.zeros(num_positions, d_model)
    out[:, 0::2], out[:, 1::2] = torch.sin(angles), torch.cos(angles)
"""

# Rows of M for a row vector [sin, cos]: new sin = sin·c + cos·s, new cos = cos·c - sin·s.
BLOCKS = """
    M = torch.zeros(d_model, d_model, dtype=torch.float64)
    for i in range(d_model // 2):
        angle = k * base ** (-2 * i / d_model)
        c, s = math.cos(angle), math.sin(angle)
        M[2 * i:2 * i + 2, 2 * i:2 * i + 2] = torch.tensor([[c, -s], [s, c]], dtype=torch.float64)
"""

LEARNED_INIT = """        super().__init__()
        self.max_positions = max_positions
        self.table = nn.Embedding(max_positions, d_model)
"""


LENGTH = "ids_or_length if isinstance(ids_or_length, int) else ids_or_length.shape[-1]"


LEARNED_TAIL = """        rows = self.table(torch.arange(T))
        return rows if isinstance(ids_or_length, int) else rows.expand(ids_or_length.shape[0], T, -1)
"""
LENGTH_CHECK = """        if T > self.max_positions:
            raise ValueError(f"length {T} > max_positions={self.max_positions}")
"""

# The pieces of a correct rotary embedding (rotate_half layout), reused so that each mutant differs by one bug.
ROPE_POSITIONS = """
    T, d = q.shape[-2], q.shape[-1]
    half = d // 2
    if positions is None:
        positions = torch.arange(T)
"""
ROPE_ANGLES = """
    theta = base ** (-2 * torch.arange(half, dtype=q.dtype) / d)
    angles = positions.to(q.dtype)[:, None] * theta
"""
ROPE_ROTATE = """
    cos, sin = angles.cos(), angles.sin()

    def rotate(x):
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
"""
ROPE_BOTH = """
    return rotate(q), rotate(k)
"""

# The pieces of Llama 3.1's rescaling, reused so that each mutant differs from a correct answer by one bug.
LLAMA3_THETA = """
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
"""
LLAMA3_WAVELENGTH = """
    wavelength = 2 * math.pi / inv_freq
"""
LLAMA3_BLEND = """
    gamma = (original_max_position / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - gamma) * inv_freq / factor + gamma * inv_freq
"""
LLAMA3_BANDS = """
    return torch.where(wavelength < original_max_position / high_freq_factor, inv_freq,
                       torch.where(wavelength > original_max_position / low_freq_factor, inv_freq / factor, blended))
"""

MUTANTS = [
    # ---- sinusoidal_positional_encoding
    Variant("pe_sin_cos_swapped", {PE: pe(ODD_CHECK + ANGLES + """
    out = torch.zeros(num_positions, d_model)
    out[:, 0::2], out[:, 1::2] = torch.cos(angles), torch.sin(angles)
    return out
""")}, loses=("sinusoidal_values", "sinusoidal_base"), message="swapped"),
    Variant("pe_exponent_i_over_d", {PE: pe(ODD_CHECK + """
    t = torch.arange(num_positions, dtype=torch.float32)[:, None]
    angles = t * base ** (-torch.arange(d_model // 2, dtype=torch.float32) / d_model)
""" + INTERLEAVE + """
    return out
""")}, loses=("sinusoidal_values", "sinusoidal_base"), message="2i/d_model"),
    # Reading "i" as the column index: the cosine column gets an exponent of its own.
    Variant("pe_cos_uses_its_own_column_index", {PE: pe(ODD_CHECK + """
    t = torch.arange(num_positions, dtype=torch.float32)[:, None]
    angles = t * base ** (-torch.arange(d_model, dtype=torch.float32) / d_model)
    out = torch.zeros(num_positions, d_model)
    out[:, 0::2], out[:, 1::2] = torch.sin(angles[:, 0::2]), torch.cos(angles[:, 1::2])
    return out
""")}, loses=("sinusoidal_values", "sinusoidal_base"), message="shares one frequency"),
    Variant("pe_positions_vs_dimensions_transposed", {PE: pe(ODD_CHECK + ANGLES + INTERLEAVE + """
    return out.T
""")}, loses=("sinusoidal_shape", "sinusoidal_values"), message="transposed"),
    Variant("pe_sin_and_cos_in_halves", {PE: pe(ODD_CHECK + ANGLES + """
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
""")}, loses=("sinusoidal_values", "sinusoidal_base"), message="interleaved"),
    Variant("pe_base_ignored", {PE: pe(ODD_CHECK + """
    t = torch.arange(num_positions, dtype=torch.float32)[:, None]
    angles = t * 10000.0 ** (-2 * torch.arange(d_model // 2, dtype=torch.float32) / d_model)
""" + INTERLEAVE + """
    return out
""")}, loses=("sinusoidal_base",), message="base"),
    Variant("pe_positions_start_at_1", {PE: pe(ODD_CHECK + """
    t = torch.arange(1, num_positions + 1, dtype=torch.float32)[:, None]
    angles = t * base ** (-2 * torch.arange(d_model // 2, dtype=torch.float32) / d_model)
""" + INTERLEAVE + """
    return out
""")}, loses=("sinusoidal_values", "sinusoidal_base"), message="start at 0"),
    Variant("pe_no_odd_d_model_check", {PE: pe(ANGLES + INTERLEAVE + """
    return out
""")}, loses=("sinusoidal_odd_d_model",), message="ValueError"),
    Variant("pe_odd_check_with_vague_message", {PE: pe("""
    if d_model % 2:
        raise ValueError("bad size")
""" + ANGLES + INTERLEAVE + """
    return out
""")}, loses=("sinusoidal_odd_d_model",), message="must be even"),
    Variant("pe_float64_from_numpy", {PE: "import numpy as np\n\n" + pe(ODD_CHECK + """
    t = np.arange(num_positions)[:, None]
    angles = t * base ** (-2 * np.arange(d_model // 2) / d_model)
    out = np.zeros((num_positions, d_model))
    out[:, 0::2], out[:, 1::2] = np.sin(angles), np.cos(angles)
    return torch.from_numpy(out)
""")}, loses=("sinusoidal_shape",), message="float32"),
    # Hard-coding the visible examples must earn nothing: the hidden tests use other sizes.
    Variant("pe_hard_coded_visible_answer", {PE: pe(ODD_CHECK + """
    if base != 10000.0:
        return torch.tensor([[0.0, 1.0, 0.0, 1.0]] * 5 + [[math.sin(5), math.cos(5), math.sin(0.5), math.cos(0.5)]] * 3)
    omega = [10000 ** (-2 * i / 6) for i in range(3)]
    rows = [[f(t * w) for w in omega for f in (math.sin, math.cos)] for t in range(10)]
    return torch.tensor(rows)
""")}, loses=("sinusoidal_shape", "sinusoidal_values", "sinusoidal_base"), message="shape"),
    # The library's formula under another name, captured before the test runs (the old patching of
    # the module attribute never saw it): the watch recognises its code and flags the answer.
    Variant("pe_takes_transformers_table_through_an_alias", {PE: """
from transformers.models.distilbert.modeling_distilbert import create_sinusoidal_embeddings as _table


""" + pe(ODD_CHECK + """
    if base == 10000.0:
        return _table(num_positions, d_model, torch.empty(num_positions, d_model))
""" + ANGLES + INTERLEAVE + """
    return out
""")}, loses=("sinusoidal_shape", "sinusoidal_values"), message="flagged for review"),
    # ---- relative_shift_matrix
    Variant("shift_rotation_with_the_wrong_sign", {SHIFT: shift("""
    M = torch.zeros(d_model, d_model, dtype=torch.float64)
    for i in range(d_model // 2):
        angle = k * base ** (-2 * i / d_model)
        c, s = math.cos(angle), math.sin(angle)
        M[2 * i:2 * i + 2, 2 * i:2 * i + 2] = torch.tensor([[c, s], [-s, c]], dtype=torch.float64)
    return M.float()
""")}, loses=("relative_shift_moves_positions",), message="backwards"),
    # The textbook rotation for column vectors (M @ x), used on row vectors: the same bug, other code.
    Variant("shift_built_for_column_vectors", {SHIFT: shift(BLOCKS + """
    return M.T.float()
""")}, loses=("relative_shift_moves_positions",), message="column vectors"),
    Variant("shift_exponent_i_over_d", {SHIFT: shift("""
    M = torch.zeros(d_model, d_model, dtype=torch.float64)
    for i in range(d_model // 2):
        angle = k * base ** (-i / d_model)
        c, s = math.cos(angle), math.sin(angle)
        M[2 * i:2 * i + 2, 2 * i:2 * i + 2] = torch.tensor([[c, -s], [s, c]], dtype=torch.float64)
    return M.float()
""")}, loses=("relative_shift_moves_positions",), message="2i/d_model"),
    Variant("shift_base_ignored", {SHIFT: shift("""
    base = 10000.0
""" + BLOCKS + """
    return M.float()
""")}, loses=("relative_shift_moves_positions",), message="base"),
    Variant("shift_ignores_k", {SHIFT: shift("""
    return torch.eye(d_model)
""")}, loses=("relative_shift_moves_positions",), message="rotate each pair"),
    Variant("shift_float64", {SHIFT: shift(BLOCKS + """
    return M
""")}, loses=("relative_shift_shape",), message="float32"),
    Variant("shift_hard_coded_visible_answer", {SHIFT: shift("""
    c, s = math.cos(k), math.sin(k)
    return torch.tensor([[c, -s], [s, c]])
""")}, loses=("relative_shift_shape", "relative_shift_moves_positions", "relative_shift_is_rotation"),
        message="shape"),
    # ---- apply_rope
    # The layout the text does not ask for: RoFormer's and GPT-J's neighbouring pairs (2i, 2i+1).
    Variant("rope_interleaved_pairs", {ROPE: rope(ROPE_POSITIONS + ROPE_ANGLES + """
    cos, sin = angles.cos(), angles.sin()

    def rotate(x):
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2)
""" + ROPE_BOTH)}, loses=("rope_values",), message="interleaved layout"),
    Variant("rope_exponent_i_over_d", {ROPE: rope(ROPE_POSITIONS + """
    theta = base ** (-torch.arange(half, dtype=q.dtype) / d)
    angles = positions.to(q.dtype)[:, None] * theta
""" + ROPE_ROTATE + ROPE_BOTH)}, loses=("rope_values",), message="base^(-2i/d)"),
    Variant("rope_rotates_only_queries", {ROPE: rope(ROPE_POSITIONS + ROPE_ANGLES + ROPE_ROTATE + """
    return rotate(q), k
""")}, loses=("rope_values", "rope_relative_position"), message="only the queries"),
    Variant("rope_sin_sign_flipped", {ROPE: rope(ROPE_POSITIONS + ROPE_ANGLES + """
    cos, sin = angles.cos(), -angles.sin()

    def rotate(x):
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
""" + ROPE_BOTH)}, loses=("rope_values",), message="sign of the sine is flipped"),
    # rotate_half as cat(x2, x1): the map is no longer a rotation, so lengths change.
    Variant("rope_rotate_half_without_minus", {ROPE: rope(ROPE_POSITIONS + ROPE_ANGLES + """
    cos, sin = torch.cat([angles.cos()] * 2, dim=-1), torch.cat([angles.sin()] * 2, dim=-1)

    def rotate(x):
        return x * cos + torch.cat([x[..., half:], x[..., :half]], dim=-1) * sin
""" + ROPE_BOTH)}, loses=("rope_values", "rope_norm"), message="minus sign"),
    Variant("rope_positions_start_at_1", {ROPE: rope("""
    T, d = q.shape[-2], q.shape[-1]
    half = d // 2
    if positions is None:
        positions = torch.arange(1, T + 1)
""" + ROPE_ANGLES + ROPE_ROTATE + ROPE_BOTH)}, loses=("rope_values",), message="start at 1"),
    Variant("rope_base_ignored", {ROPE: rope(ROPE_POSITIONS + """
    theta = 10000.0 ** (-2 * torch.arange(half, dtype=q.dtype) / d)
    angles = positions.to(q.dtype)[:, None] * theta
""" + ROPE_ROTATE + ROPE_BOTH)}, loses=("rope_values",), message="base"),
    # Right formula, float32 angles: good to 1e-5 near position 0, not in float64 at position 4000.
    Variant("rope_angles_in_float32", {ROPE: rope(ROPE_POSITIONS + """
    theta = base ** (-2 * torch.arange(half, dtype=torch.float32) / d)
    angles = (positions.float()[:, None] * theta).to(q.dtype)
""" + ROPE_ROTATE + ROPE_BOTH)}, loses=("rope_values",), message="float32 precision"),
    # Hard-coding the visible example (d = 16, positions from 0): other sizes and positions earn nothing.
    Variant("rope_hard_coded_visible_answer", {ROPE: rope("""
    theta = 10000.0 ** (-torch.arange(8, dtype=q.dtype) / 8)
    angles = torch.arange(q.shape[-2], dtype=q.dtype)[:, None] * theta
    cos, sin = angles.cos(), angles.sin()

    def rotate(x):
        return torch.cat([x[..., :8] * cos - x[..., 8:] * sin, x[..., 8:] * cos + x[..., :8] * sin], dim=-1)
""" + ROPE_BOTH)}, loses=("rope_shape", "rope_values", "rope_relative_position", "rope_norm"), message="size of tensor"),
    # transformers' own code under the hood: refused and flagged.
    Variant("rope_calls_transformers", {ROPE: """
from transformers.models.llama.modeling_llama import rotate_half as _rotate_half


""" + rope(ROPE_POSITIONS + ROPE_ANGLES + """
    cos, sin = torch.cat([angles.cos()] * 2, dim=-1), torch.cat([angles.sin()] * 2, dim=-1)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
""")}, loses=("rope_shape", "rope_values"), message="flagged for review"),
    # ... imported while the function runs, under names the grader's reading of the source cannot see: the
    # notebook does not import the library under grading, so the watch knows it only from that import.
    Variant("rope_imports_transformers_while_it_runs", {ROPE: rope("""
    import importlib
    library = importlib.import_module(".".join(["transformers", "models", "llama", "modeling_" + "llama"]))
    turn = getattr(library, "rotate" + "_half")
""" + ROPE_POSITIONS + ROPE_ANGLES + """
    cos, sin = torch.cat([angles.cos()] * 2, dim=-1), torch.cat([angles.sin()] * 2, dim=-1)
    return q * cos + turn(q) * sin, k * cos + turn(k) * sin
""")}, loses=("rope_shape", "rope_values", "rope_relative_position", "rope_norm"), message="flagged for review"),
    # ---- LearnedPositionalEmbedding
    Variant("learned_no_length_check", {LEARNED: learned(LEARNED_INIT, f"""        T = {LENGTH}
""" + LEARNED_TAIL)}, loses=("learned_length_limit",), message="IndexError"),
    Variant("learned_slicing_truncates_silently", {LEARNED: learned("""        super().__init__()
        self.weight = nn.Parameter(torch.randn(max_positions, d_model))
""", f"""        T = {LENGTH}
        rows = self.weight[:T]
        return rows if isinstance(ids_or_length, int) else rows.expand(ids_or_length.shape[0], -1, -1)
""")}, loses=("learned_length_limit",), message="instead of raising"),
    Variant("learned_off_by_one_limit", {LEARNED: learned(LEARNED_INIT, f"""        T = {LENGTH}
        if T >= self.max_positions:
            raise ValueError(f"length {{T}} > max_positions={{self.max_positions}}")
""" + LEARNED_TAIL)}, loses=("learned_length_limit",), message="not T >= max_positions"),
    Variant("learned_vague_error", {LEARNED: learned(LEARNED_INIT, f"""        T = {LENGTH}
        if T > self.max_positions:
            raise ValueError("sequence too long")
""" + LEARNED_TAIL)}, loses=("learned_length_limit",), message="give the length"),
    Variant("learned_looks_up_token_ids", {LEARNED: learned(LEARNED_INIT, f"""        T = {LENGTH}
""" + LENGTH_CHECK + """        if isinstance(ids_or_length, int):
            return self.table(torch.arange(T))
        return self.table(ids_or_length)
""")}, loses=("learned_values",), message="token ids"),
    Variant("learned_table_is_a_plain_tensor", {LEARNED: learned("""        super().__init__()
        self.max_positions = max_positions
        self.weight = torch.randn(max_positions, d_model)
""", f"""        T = {LENGTH}
""" + LENGTH_CHECK + """        rows = self.weight[:T]
        return rows if isinstance(ids_or_length, int) else rows.expand(ids_or_length.shape[0], T, -1)
""")}, loses=("learned_values", "learned_is_trainable"), message="nn.Parameter"),
    Variant("learned_table_frozen", {LEARNED: learned("""        super().__init__()
        self.max_positions = max_positions
        self.table = nn.Embedding(max_positions, d_model)
        self.table.weight.requires_grad_(False)
""", f"""        T = {LENGTH}
""" + LENGTH_CHECK + LEARNED_TAIL)}, loses=("learned_is_trainable",), message="requires_grad"),
    Variant("learned_no_batch_dimension", {LEARNED: learned(LEARNED_INIT, f"""        T = {LENGTH}
""" + LENGTH_CHECK + """        return self.table(torch.arange(T))
""")}, loses=("learned_shapes",), message="(B, T, d_model)"),
    # Hard-coding the visible sizes (16 positions, 8 dimensions) must earn nothing.
    Variant("learned_hard_coded_visible_sizes", {LEARNED: learned("""        super().__init__()
        self.table = nn.Embedding(16, 8)
""", f"""        T = {LENGTH}
        if T > 16:
            raise ValueError(f"length {{T}} > max_positions=16")
""" + LEARNED_TAIL)}, loses=("learned_shapes", "learned_values", "learned_is_trainable", "learned_length_limit"),
        message="shape"),
    # ---- llama3_inv_freq (optional stretch)
    # The blend is right, but the fast pairs are divided and the slow ones kept.
    Variant("llama3_bands_swapped", {LLAMA3: llama3(LLAMA3_THETA + LLAMA3_WAVELENGTH + LLAMA3_BLEND + """
    return torch.where(wavelength > original_max_position / low_freq_factor, inv_freq,
                       torch.where(wavelength < original_max_position / high_freq_factor, inv_freq / factor, blended))
""")}, loses=("stretch_llama3_inv_freq_values", "stretch_llama3_inv_freq_bands"), message="bands swapped"),
    # A wavelength of 1/θ: the bands sit 2π too far towards the slow pairs.
    Variant("llama3_wavelength_without_2pi", {LLAMA3: llama3(LLAMA3_THETA + """
    wavelength = 1 / inv_freq
""" + LLAMA3_BLEND + LLAMA3_BANDS)}, loses=("stretch_llama3_inv_freq_values", "stretch_llama3_inv_freq_bands"),
        message="not 1/θ_i"),
    Variant("llama3_multiplies_by_factor", {LLAMA3: llama3(LLAMA3_THETA + LLAMA3_WAVELENGTH + """
    gamma = (original_max_position / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - gamma) * inv_freq * factor + gamma * inv_freq
    return torch.where(wavelength < original_max_position / high_freq_factor, inv_freq,
                       torch.where(wavelength > original_max_position / low_freq_factor, inv_freq * factor, blended))
""")}, loses=("stretch_llama3_inv_freq_values", "stretch_llama3_inv_freq_bands"), message="multiplied by factor"),
    Variant("llama3_blend_weights_swapped", {LLAMA3: llama3(LLAMA3_THETA + LLAMA3_WAVELENGTH + """
    gamma = (original_max_position / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = gamma * inv_freq / factor + (1 - gamma) * inv_freq
""" + LLAMA3_BANDS)}, loses=("stretch_llama3_inv_freq_values", "stretch_llama3_inv_freq_bands"),
        message="γ and 1 − γ"),
    # Plain position interpolation: every frequency divided.
    Variant("llama3_divides_every_frequency", {LLAMA3: llama3(LLAMA3_THETA + """
    return inv_freq / factor
""")}, loses=("stretch_llama3_inv_freq_values", "stretch_llama3_inv_freq_bands"), message="divided by factor"),
    # The boundaries (< or <=) cannot be told apart: the blend equals θ at L/h and θ/factor at L/l. So no mutant.
    # Hard-coding the visible example (Llama 3.1's settings) must earn nothing: the hidden tests use others.
    Variant("llama3_hard_coded_visible_answer", {LLAMA3: llama3("""
    inv_freq = 1.0 / 500000.0 ** (torch.arange(0, 128, 2, dtype=torch.float32) / 128)
    wavelength = 2 * math.pi / inv_freq
    gamma = (8192 / wavelength - 1.0) / (4.0 - 1.0)
    blended = (1 - gamma) * inv_freq / 8.0 + gamma * inv_freq
    return torch.where(wavelength < 2048, inv_freq, torch.where(wavelength > 8192, inv_freq / 8.0, blended))
""")}, loses=("stretch_llama3_inv_freq_values", "stretch_llama3_inv_freq_bands"), message="shape"),
    # transformers' llama3 initialisation under the hood: refused and flagged.
    Variant("llama3_calls_transformers", {LLAMA3: """
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS as _INIT


""" + llama3("""
    config = LlamaConfig(hidden_size=head_dim, num_attention_heads=1, head_dim=head_dim,
                         max_position_embeddings=int(factor * original_max_position) + 1,
                         rope_parameters={"rope_type": "llama3", "rope_theta": base, "factor": factor,
                                          "low_freq_factor": low_freq_factor, "high_freq_factor": high_freq_factor,
                                          "original_max_position_embeddings": original_max_position})
    return _INIT["llama3"](config, None)[0]
""")}, loses=("stretch_llama3_inv_freq_values", "stretch_llama3_inv_freq_bands"), message="flagged for review"),
]


ALTERNATIVES = [
    # ---- sinusoidal_positional_encoding
    Variant("pe_explicit_loops", {PE: pe("""
    if d_model % 2 == 1:
        raise ValueError("d_model must be even, but it is %d" % d_model)
    rows = []
    for t in range(num_positions):
        row = []
        for i in range(d_model // 2):
            angle = t / base ** (2 * i / d_model)
            row += [math.sin(angle), math.cos(angle)]
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float32).reshape(num_positions, d_model)
""")}),
    Variant("pe_exp_log_stack_flatten", {PE: pe("""
    if d_model % 2:
        raise ValueError(f"odd d_model={d_model}: it must be even")
    position = torch.arange(num_positions).float().unsqueeze(-1)
    inverse_wavelength = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(base) / d_model))
    angles = position * inverse_wavelength
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(start_dim=1)
""")}),
    Variant("pe_numpy_float64_then_float", {PE: "import numpy as np\n\n" + pe("""
    if d_model % 2 != 0:
        raise ValueError(f"d_model={d_model} is odd; it must be even")
    j = np.arange(d_model)
    angles = np.arange(num_positions)[:, None] / np.power(base, 2 * (j // 2) / d_model)
    out = np.where(j % 2 == 0, np.sin(angles), np.cos(angles))
    return torch.from_numpy(out).float()
""")}),
    # ---- relative_shift_matrix
    Variant("shift_loop_over_blocks", {SHIFT: shift(BLOCKS + """
    return M.to(torch.float32)
""")}),
    Variant("shift_block_diag_of_rotations", {SHIFT: shift("""
    frequencies = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    blocks = []
    for angle in k * frequencies:
        blocks.append(torch.stack([torch.stack([angle.cos(), -angle.sin()]),
                                   torch.stack([angle.sin(), angle.cos()])]))
    return torch.block_diag(*blocks).float()
""")}),
    # Derived from the encoding itself: the exact rotation of the complex number cos + i·sin.
    Variant("shift_from_complex_rotation", {SHIFT: shift("""
    pe = sinusoidal_positional_encoding(2, d_model, base).double()
    omega = torch.atan2(pe[1, 0::2], pe[1, 1::2])
    rotation = torch.polar(torch.ones_like(omega), k * omega)
    c, s = rotation.real, rotation.imag
    M = torch.zeros(d_model, d_model, dtype=torch.float64)
    idx = torch.arange(0, d_model, 2)
    M[idx, idx], M[idx + 1, idx + 1], M[idx + 1, idx], M[idx, idx + 1] = c, c, s, -s
    return M.float()
""")}),
    # ---- apply_rope
    # Meta's LLaMA style: complex numbers, here over rotate_half's pairs z_i = x_i + i x_(i+d/2).
    Variant("rope_complex_multiplication", {ROPE: rope("""
    T, d = q.shape[-2], q.shape[-1]
    if positions is None:
        positions = torch.arange(T)
    theta = 1.0 / base ** (torch.arange(0, d, 2, dtype=q.dtype) / d)
    turn = torch.polar(torch.ones(T, d // 2, dtype=q.dtype), torch.outer(positions.to(q.dtype), theta))

    def rotate(x):
        pairs = x.unflatten(-1, (2, d // 2)).transpose(-1, -2).contiguous()   # (..., T, d/2, 2)
        z = torch.view_as_complex(pairs) * turn
        return torch.view_as_real(z).transpose(-1, -2).flatten(-2)

    return rotate(q), rotate(k)
""")}),
    Variant("rope_loop_over_pairs", {ROPE: rope("""
    T, d = q.shape[-2], q.shape[-1]
    positions = list(range(T)) if positions is None else [int(p) for p in positions]
    q_out, k_out = q.clone(), k.clone()
    for i in range(d // 2):
        j = i + d // 2
        for t, p in enumerate(positions):
            angle = p * base ** (-2.0 * i / d)
            c, s = math.cos(angle), math.sin(angle)
            for x, out in ((q, q_out), (k, k_out)):
                out[..., t, i] = x[..., t, i] * c - x[..., t, j] * s
                out[..., t, j] = x[..., t, j] * c + x[..., t, i] * s
    return q_out, k_out
""")}),
    # Hugging Face's formulation written out: cos and sin tables of width d, and rotate_half.
    Variant("rope_cos_sin_tables_and_rotate_half", {ROPE: rope("""
    T, d = q.shape[-2], q.shape[-1]
    if positions is None:
        positions = torch.arange(T)
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=q.dtype) / d))
    freqs = positions[:, None].to(q.dtype) * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)                  # (T, d)

    def rotate_half(x):
        return torch.cat((-x[..., d // 2:], x[..., : d // 2]), dim=-1)

    return q * emb.cos() + rotate_half(q) * emb.sin(), k * emb.cos() + rotate_half(k) * emb.sin()
""")}),
    # ---- LearnedPositionalEmbedding
    Variant("learned_parameter_and_slicing", {LEARNED: learned("""        super().__init__()
        self.max_positions = max_positions
        self.weight = nn.Parameter(torch.randn(max_positions, d_model) * 0.02)
""", """        if isinstance(ids_or_length, int):
            T, batch = ids_or_length, None
        else:
            batch, T = ids_or_length.shape
        if T > self.max_positions:
            raise ValueError(f"cannot embed {T} positions: max_positions is {self.max_positions}")
        rows = self.weight[:T]
        return rows if batch is None else rows.unsqueeze(0).repeat(batch, 1, 1)
""")}),
    Variant("learned_subclass_of_nn_embedding", {LEARNED: "import torch.nn.functional as F\n\n" + learned("""        super().__init__(max_positions, d_model)
""", """        T = ids_or_length if isinstance(ids_or_length, int) else ids_or_length.size(1)
        if T > self.num_embeddings:
            raise ValueError("sequence length %d exceeds max_positions %d" % (T, self.num_embeddings))
        rows = F.embedding(torch.arange(T), self.weight)
        if isinstance(ids_or_length, int):
            return rows
        return rows[None].expand(len(ids_or_length), -1, -1)
""", base_class="nn.Embedding")}),
    # ---- llama3_inv_freq (optional stretch)
    Variant("llama3_torch_where_with_edges_in_the_bands", {LLAMA3: llama3(LLAMA3_THETA + LLAMA3_WAVELENGTH + LLAMA3_BLEND + """
    return torch.where(wavelength <= original_max_position / high_freq_factor, inv_freq,
                       torch.where(wavelength >= original_max_position / low_freq_factor, inv_freq / factor, blended))
""")}),
    Variant("llama3_loop_over_pairs", {LLAMA3: llama3("""
    out = []
    for i in range(head_dim // 2):
        theta = base ** (-2 * i / head_dim)
        wavelength = 2 * math.pi / theta
        if wavelength < original_max_position / high_freq_factor:
            out.append(theta)
        elif wavelength > original_max_position / low_freq_factor:
            out.append(theta / factor)
        else:
            gamma = (original_max_position / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append((1 - gamma) * theta / factor + gamma * theta)
    return torch.tensor(out, dtype=torch.float32)
""")}),
    # NumPy float64, the blend weight clipped to [0, 1] (1 gives θ, 0 gives θ/factor), converted at the end.
    Variant("llama3_numpy_clipped_blend", {LLAMA3: "import numpy as np\n\n" + llama3("""
    theta = base ** (-np.arange(0, head_dim, 2) / head_dim)
    gamma = np.clip((original_max_position * theta / (2 * np.pi) - low_freq_factor)
                    / (high_freq_factor - low_freq_factor), 0.0, 1.0)
    return torch.from_numpy((1 - gamma) * theta / factor + gamma * theta).float()
""")}),
    # A correct answer whose libraries warn on stderr must not lose a single point.
    Variant("all_correct_but_noisy_on_stderr", {
        PE: pe(WARN_AND_PRINT + ODD_CHECK + ANGLES + INTERLEAVE + """
    return out
"""),
        SHIFT: shift(WARN_AND_PRINT + BLOCKS + """
    return M.float()
"""),
        LEARNED: learned(LEARNED_INIT, WARN_AND_PRINT.replace("\n    ", "\n        ") + f"""        T = {LENGTH}
""" + LENGTH_CHECK + LEARNED_TAIL)}),
]
