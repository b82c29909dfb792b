"""The export kernel of xLSTM's mLSTM recurrence (transformers' ``xlstm``: xLSTM-7b).

transformers' ``xLSTMBackend.forward`` runs the mLSTM cell of every layer through a partial
built when the module is made: in inference mode, ``wrap_chunkwise_arbitrary_sequence_length``
splits the new tokens into whole chunks of ``chunk_size`` (the chunkwise-parallel form, a
Python loop over the chunks) and a remainder (a Python loop of single steps), and one new token
takes the step kernel alone. ``torch.export`` fixes all three to the example length. No
hub-kernel contract names it, so the kernel replaces the method by its qualified name,
``xLSTMBackend.forward`` (:data:`METHODS`, read by :func:`irkit.llm.kernels.export_kernels`).

Per head and token ``t``, with the state ``(C, n, m)`` (``C`` a ``(qk_head_dim, v_head_dim)``
matrix, ``n`` a ``qk_head_dim`` normalizer, ``m`` the log-space stabilizer, all in the config's
``inference_state_dtype``), input gate ``i_t`` and forget gate ``f_t`` (pre-activations)::

    m' = max(logsigmoid(f_t) + m, i_t)
    C  = exp(logsigmoid(f_t) + m − m') · C + exp(i_t − m') · k_t ⊗ v_t
    n  = exp(logsigmoid(f_t) + m − m') · n + exp(i_t − m') · k_t
    h_t = (q_t/√d · C) / (max(|q_t/√d · n|, exp(−m')) + eps)

transformers' step kernel (``mlstm_recurrent_step_native``), the same operations in the same
order, as one ``scan`` over the tokens: a one-token step is the reference's decode step
exactly; a prompt equals its chunkwise form up to float32 rounding (the chunks compute the
same stabilizer ``m`` at every token, so the same normalized sums, in another order).

The model reads no attention mask (transformers' xLSTM ignores it): pads are tokens to it, in
transformers and in the exported model alike, so the step mask is not read here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from irkit.errors import ExportError

if TYPE_CHECKING:
    import torch

__all__ = ["METHODS", "mlstm_scan", "backend_forward"]

State = tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]


def mlstm_scan(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    igate: torch.Tensor,
    fgate: torch.Tensor,
    state: State | None = None,
    eps: float = 1e-6,
    dtype_state: Any = None,
) -> tuple[torch.Tensor, State]:
    """The mLSTM recurrence over the tokens, one ``scan`` step each (module docstring).

    Args:
        query: ``(batch, heads, seq, qk_head_dim)``.
        key: ``(batch, heads, seq, qk_head_dim)``.
        value: ``(batch, heads, seq, v_head_dim)``.
        igate: ``(batch, heads, seq)``, the input gate's pre-activation.
        fgate: ``(batch, heads, seq)``, the forget gate's pre-activation.
        state: ``(C (batch, heads, qk_head_dim, v_head_dim), n (batch, heads, qk_head_dim),
            m (batch, heads, 1))`` before the first token, or None (zeros).
        eps: Added to the output's denominator.
        dtype_state: The state's dtype (default float32, the config's
            ``inference_state_dtype``).

    Returns:
        ``(h (batch, heads, seq, v_head_dim) in query's dtype, (C, n, m) after the last
        token, in ``dtype_state``)``.
    """
    import torch
    from torch._higher_order_ops.scan import scan_op

    acc = torch.float32 if dtype_state is None else dtype_state
    dtype = query.dtype
    batch, heads, _, qk_dim = query.shape
    if state is None:  # (transformers' inference path starts from float32 zeros)
        zeros = query.new_zeros
        state = (
            zeros(batch, heads, qk_dim, value.shape[-1], dtype=torch.float32),
            zeros(batch, heads, qk_dim, dtype=torch.float32),
            zeros(batch, heads, 1, dtype=torch.float32),
        )
    # (no alias of a state the caller keeps: the model copies the new state into it after)
    init = [(s if s.dtype == acc else s.to(acc)).contiguous() for s in state]
    operands = [query, key, value, igate[..., None], fgate[..., None]]

    def step(*operands: torch.Tensor) -> list[torch.Tensor]:
        c_old, n_old, m_old, q, k, v, i, f = operands
        f_log = torch.nn.functional.logsigmoid(f)
        m_new = torch.max(f_log + m_old, i)
        f_act = torch.exp(f_log + m_old - m_new)
        i_act = torch.exp(i - m_new)
        q_scaled = q * (qk_dim ** (-0.5))
        c_new = f_act[:, :, :, None] * c_old + i_act[:, :, :, None] * (
            k[:, :, :, None] @ v[:, :, None, :]
        )
        n_new = f_act * n_old + i_act * k
        h_num = (q_scaled[:, :, None, :] @ c_new.to(dtype)).squeeze(2).to(acc)
        qn = (q_scaled[:, :, None, :] @ n_new[:, :, :, None].to(dtype)).squeeze(2)
        h_denom = (torch.maximum(qn.abs(), torch.exp(-m_new)) + eps).to(acc)
        h = (h_num / h_denom).to(dtype)
        return [c_new.to(acc), n_new.to(acc), m_new.to(acc), h]

    # torch's scan operator itself, token-major (the ``scan`` function would compile the body
    # with dynamo first: seconds per layer)
    c, n, m, h = scan_op(step, init, [x.movedim(2, 0) for x in operands], ())
    return h.movedim(0, 2), (c, n, m)


def backend_forward(
    self: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    igate: torch.Tensor,
    fgate: torch.Tensor,
    c_initial: torch.Tensor | None = None,
    n_initial: torch.Tensor | None = None,
    m_initial: torch.Tensor | None = None,
    return_last_states: bool | None = None,
    mode: str | None = None,
) -> Any:
    """``xLSTMBackend.forward`` as :func:`mlstm_scan`, one path for every length.

    Args:
        self: The ``xLSTMBackend`` (its ``config``: ``mode``, ``eps``,
            ``inference_state_dtype``, ``return_last_states``).
        query: ``(batch, heads, seq, qk_head_dim)``.
        key: ``(batch, heads, seq, qk_head_dim)``.
        value: ``(batch, heads, seq, v_head_dim)``.
        igate: ``(batch, heads, seq)``.
        fgate: ``(batch, heads, seq)``.
        c_initial: ``(batch, heads, qk_head_dim, v_head_dim)`` or None.
        n_initial: ``(batch, heads, qk_head_dim)`` or None.
        m_initial: ``(batch, heads, 1)`` or None.
        return_last_states: In a training mode, whether the states are returned (default: the
            config's); the inference mode always returns them, as transformers' does.
        mode: ``"inference"`` or a training mode (default: the config's).

    Returns:
        ``(h, (C, n, m))``, or ``h`` alone where transformers' training path returns it alone.

    Raises:
        ExportError: A mode transformers knows no path for, or initial states given in part.
    """
    import torch

    config = self.config
    mode = config.mode if mode is None else mode
    if "train" not in mode and "inference" not in mode:
        raise ExportError(
            f"irkit export kernel 'xLSTMBackend.forward': mode {mode!r} is neither a training "
            "nor the inference mode (transformers raises too); set config.mode='inference'"
        )
    state: State | None = None
    if c_initial is not None and n_initial is not None and m_initial is not None:
        state = (c_initial, n_initial, m_initial)
    elif c_initial is not None or n_initial is not None or m_initial is not None:
        given = [s is not None for s in (c_initial, n_initial, m_initial)]
        raise ExportError(
            "irkit export kernel 'xLSTMBackend.forward': initial states given in part "
            f"(c, n, m given: {given}); pass all three or none"
        )
    dtype_state = getattr(torch, config.inference_state_dtype)
    h, last = mlstm_scan(query, key, value, igate, fgate, state, config.eps, dtype_state)
    if "train" in mode:
        wanted = config.return_last_states if return_last_states is None else return_last_states
        if not wanted:
            return h
    return h, last


#: Qualified name (in the model's modeling module) of the method replaced → export kernel.
METHODS: dict[str, Callable[..., Any]] = {"xLSTMBackend.forward": backend_forward}
