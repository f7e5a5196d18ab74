"""The engine in-process over libds4's C ABI (bridge/ds4_bridge.h).

    import ds4
    m = ds4.Model("model.gguf", backend="cpu")
    s = m.session(ctx=512)
    s.sync(m.tokenize("def fib(n):"))
    for _ in range(16):
        t = s.sample()            # greedy; s.sample(temperature=0.8, seed=1) samples
        s.eval(t)
    logits = s.logits()           # array('f'), len == m.vocab_size; memoryview(logits) works

Handles are thread-affine (use a session from one thread at a time).
"""
import array
import ctypes as C
from typing import Callable, List, Optional, Sequence

from ._lib import Ds4Error, cstr, fn, load

BACKENDS = {"cuda": 0, "cpu": 2, "auto": 3}
# The libds4 ABI these bindings are written for (bridge/CMakeLists.txt SOVERSION).
LIBDS4_SONAME = "libds4.so.3"


class _OpenOptions(C.Structure):
    # The leading fields of ds4_bridge_model_open_options; _reserve leaves room for fields a
    # newer libds4 appends (ds4_bridge_model_open_options_init fills the whole struct).
    _fields_ = [("model_path", C.c_char_p), ("mtp_path", C.c_char_p), ("backend", C.c_int32),
                ("n_threads", C.c_int32), ("defer_boot_prewarm", C.c_int32), ("ssd_streaming", C.c_int32),
                ("ssd_streaming_cold", C.c_int32), ("ssd_streaming_cache_experts", C.c_uint32),
                ("ssd_streaming_cache_bytes", C.c_uint64), ("mtp_draft_tokens", C.c_int32),
                ("tensor_directory", C.c_void_p), ("bind_plan", C.c_void_p), ("_reserve", C.c_uint8 * 512)]


class _ModelInfo(C.Structure):
    _fields_ = [("family", C.c_char * 32), ("name", C.c_char * 64), ("n_layer", C.c_int32),
                ("n_embd", C.c_int32), ("n_vocab", C.c_int32), ("n_head", C.c_int32), ("head_dim", C.c_int32),
                ("n_expert", C.c_int32), ("n_expert_used", C.c_int32), ("n_ctx_max", C.c_int32),
                ("fingerprint", C.c_uint64)]


class _ChatMsg(C.Structure):
    _fields_ = [("role", C.c_char_p), ("content", C.c_char_p), ("content_len", C.c_size_t)]


_PROGRESS_FN = C.CFUNCTYPE(None, C.c_void_p, C.c_int32, C.c_int32)
_lib = None


def _api():
    global _lib
    if _lib is not None:
        return _lib
    L = load(LIBDS4_SONAME, "DS4_LIBRARY")
    E = (C.c_char_p, C.c_size_t)
    P = C.c_void_p
    I32P = C.POINTER(C.c_int32)
    fn(L, "ds4_bridge_model_open_options_init", None, C.POINTER(_OpenOptions))
    fn(L, "ds4_bridge_model_open", C.c_int, C.POINTER(P), C.POINTER(_OpenOptions), *E)
    fn(L, "ds4_bridge_model_free", None, P)
    fn(L, "ds4_bridge_model_vocab_size", C.c_int32, P)
    fn(L, "ds4_bridge_model_info", C.c_int, P, C.POINTER(_ModelInfo), *E)
    fn(L, "ds4_bridge_session_create", C.c_int, C.POINTER(P), P, C.c_int, *E)
    fn(L, "ds4_bridge_session_free", None, P)
    fn(L, "ds4_bridge_session_sync_cb", C.c_int, P, I32P, C.c_int, _PROGRESS_FN, P, *E)
    fn(L, "ds4_bridge_eval", C.c_int, P, C.c_int32, *E)
    fn(L, "ds4_bridge_session_argmax", C.c_int, P, I32P, *E)
    fn(L, "ds4_bridge_session_sample", C.c_int, P, C.c_float, C.c_int, C.c_float, C.c_float,
       C.POINTER(C.c_uint64), I32P, *E)
    fn(L, "ds4_bridge_session_logits", C.c_int, P, C.POINTER(C.c_float), C.c_int, *E)
    fn(L, "ds4_bridge_session_pos", C.c_int, P)
    fn(L, "ds4_bridge_session_ctx", C.c_int, P)
    fn(L, "ds4_bridge_session_rewind", C.c_int, P, C.c_int, *E)
    fn(L, "ds4_bridge_session_save_payload", C.c_int, P, C.c_char_p, *E)
    fn(L, "ds4_bridge_session_load_payload", C.c_int, P, C.c_char_p, *E)
    fn(L, "ds4_bridge_session_payload_size", C.c_int, P, C.POINTER(C.c_uint64), *E)
    fn(L, "ds4_bridge_session_save_payload_mem", C.c_int, P, C.POINTER(C.c_uint8), C.c_size_t,
       C.POINTER(C.c_size_t), *E)
    fn(L, "ds4_bridge_session_load_payload_mem", C.c_int, P, C.POINTER(C.c_uint8), C.c_size_t, *E)
    fn(L, "ds4_bridge_tokenize_text", C.c_int, P, C.c_char_p, C.c_size_t, I32P, C.c_int, C.POINTER(C.c_int), *E)
    fn(L, "ds4_bridge_detokenize", C.c_int, P, I32P, C.c_int, C.c_char_p, C.c_size_t, C.POINTER(C.c_size_t), *E)
    fn(L, "ds4_bridge_render_chat", C.c_int, P, C.POINTER(_ChatMsg), C.c_int, C.c_int, C.c_int, I32P, C.c_int,
       C.POINTER(C.c_int), *E)
    fn(L, "ds4_bridge_token_eos", C.c_int32, P)
    fn(L, "ds4_bridge_token_is_stop", C.c_int, P, C.c_int32)
    _lib = L
    return L


def _check(name, *args):
    err = C.create_string_buffer(1024)
    rc = getattr(_api(), name)(*args, err, len(err))
    if rc != 0:
        raise Ds4Error(cstr(err.raw), rc)


def _i32(tokens):
    return (C.c_int32 * len(tokens))(*tokens) if tokens else (C.c_int32 * 1)()


class Model:
    """A GGUF model opened in this process. backend: "auto", "cpu" or "cuda"."""

    def __init__(self, path: str, *, backend: str = "auto", threads: int = 0, mtp_path: Optional[str] = None):
        if backend not in BACKENDS:
            raise ValueError("backend must be one of %s" % ", ".join(BACKENDS))
        o = _OpenOptions()
        _api().ds4_bridge_model_open_options_init(C.byref(o))
        o.model_path = path.encode()
        o.mtp_path = mtp_path.encode() if mtp_path else None
        o.backend = BACKENDS[backend]
        o.n_threads = threads
        h = C.c_void_p()
        _check("ds4_bridge_model_open", C.byref(h), C.byref(o))
        self._h = h
        self.vocab_size = _api().ds4_bridge_model_vocab_size(h)

    def close(self):
        """Frees the model (its sessions must be closed first)."""
        if getattr(self, "_h", None):
            _api().ds4_bridge_model_free(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def info(self) -> dict:
        mi = _ModelInfo()
        _check("ds4_bridge_model_info", self._h, C.byref(mi))
        d = {f: getattr(mi, f) for f, _ in _ModelInfo._fields_}
        d["family"], d["name"] = cstr(mi.family), cstr(mi.name)
        return d

    @property
    def eos(self) -> int:
        return _api().ds4_bridge_token_eos(self._h)

    def is_stop(self, token: int) -> bool:
        return _api().ds4_bridge_token_is_stop(self._h, token) == 1

    def tokenize(self, text: str) -> List[int]:
        b = text.encode()
        n = C.c_int()
        cap = len(b) + 16
        buf = (C.c_int32 * cap)()
        _check("ds4_bridge_tokenize_text", self._h, b, len(b), buf, cap, C.byref(n))
        return list(buf[: n.value])

    def detokenize(self, tokens: Sequence[int]) -> str:
        n = C.c_size_t()
        cap = 64 + 32 * len(tokens)
        for _ in range(2):
            buf = C.create_string_buffer(cap)
            try:
                _check("ds4_bridge_detokenize", self._h, _i32(tokens), len(tokens), buf, cap, C.byref(n))
                return buf.raw[: n.value].decode("utf-8", "replace")
            except Ds4Error:
                if n.value + 1 <= cap:
                    raise
                cap = n.value + 1
        raise Ds4Error("detokenize: buffer size did not settle")

    def render_chat(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                    thinking: bool = False) -> List[int]:
        """Token ids of messages ([{"role": ..., "content": ...}]) in the chat template."""
        contents = [m["content"].encode() for m in messages]
        roles = [m["role"].encode() for m in messages]
        msgs = (_ChatMsg * max(1, len(messages)))()
        for i, (r, c) in enumerate(zip(roles, contents)):
            msgs[i] = _ChatMsg(r, c, len(c))
        cap = 64 + sum(len(c) + 16 for c in contents)
        buf = (C.c_int32 * cap)()
        n = C.c_int()
        _check("ds4_bridge_render_chat", self._h, msgs, len(messages), int(add_generation_prompt), int(thinking), buf,
               cap, C.byref(n))
        return list(buf[: n.value])

    def session(self, ctx: int = 4096) -> "Session":
        return Session(self, ctx)


class Session:
    """A sequence's state (caches, history, last logits) on a Model."""

    def __init__(self, model: Model, ctx: int):
        h = C.c_void_p()
        _check("ds4_bridge_session_create", C.byref(h), model._h, ctx)
        self._h = h
        self.model = model
        self._rng = C.c_uint64(0)

    def close(self):
        if getattr(self, "_h", None):
            _api().ds4_bridge_session_free(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def pos(self) -> int:
        return _api().ds4_bridge_session_pos(self._h)

    @property
    def ctx(self) -> int:
        return _api().ds4_bridge_session_ctx(self._h)

    def sync(self, tokens: Sequence[int], progress: Optional[Callable[[int, int], None]] = None):
        """Makes the history equal tokens (reusing the common prefix) and computes the logits
        after the last one. progress(current, total) is called at chunk frontiers."""
        cb = _PROGRESS_FN((lambda ud, cur, tot: progress(cur, tot)) if progress else (lambda ud, cur, tot: None))
        _check("ds4_bridge_session_sync_cb", self._h, _i32(tokens), len(tokens), cb, None)

    def eval(self, token: int):
        _check("ds4_bridge_eval", self._h, token)

    def argmax(self) -> int:
        t = C.c_int32()
        _check("ds4_bridge_session_argmax", self._h, C.byref(t))
        return t.value

    def seed(self, seed: int):
        """Sets the sampling generator's state."""
        self._rng.value = seed

    def sample(self, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0) -> int:
        """A token from the last logits (greedy at temperature 0); the session's generator advances."""
        t = C.c_int32()
        _check("ds4_bridge_session_sample", self._h, temperature, top_k, top_p, min_p, C.byref(self._rng), C.byref(t))
        return t.value

    def logits(self) -> array.array:
        """The last position's logits as array('f') (supports the buffer protocol: memoryview)."""
        n = self.model.vocab_size
        out = array.array("f", bytes(4 * n))
        addr, _ = out.buffer_info()
        _check("ds4_bridge_session_logits", self._h, C.cast(addr, C.POINTER(C.c_float)), n)
        return out

    def rewind(self, pos: int):
        _check("ds4_bridge_session_rewind", self._h, pos)

    def save_payload(self, path: str):
        _check("ds4_bridge_session_save_payload", self._h, path.encode())

    def load_payload(self, path: str):
        _check("ds4_bridge_session_load_payload", self._h, path.encode())

    def payload(self) -> bytes:
        """The session's payload (docs/ARCHITECTURE.md section 4) in memory."""
        size = C.c_uint64()
        _check("ds4_bridge_session_payload_size", self._h, C.byref(size))
        buf = (C.c_uint8 * size.value)()
        n = C.c_size_t()
        _check("ds4_bridge_session_save_payload_mem", self._h, buf, size.value, C.byref(n))
        return bytes(buf[: n.value])

    def load_payload_bytes(self, data: bytes):
        buf = (C.c_uint8 * len(data)).from_buffer_copy(data)
        _check("ds4_bridge_session_load_payload_mem", self._h, buf, len(data))
