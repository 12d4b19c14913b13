"""Softmax cross-entropy normalised by the GLOBAL batch size.

Data parallelism splits one global batch of ``B`` samples over ranks and
micro-batches. If each piece divided its loss by its *own* size, the pieces'
gradients would not add up to the full-batch gradient. Here every piece divides by
the global ``B`` it is given, so::

    sum over pieces of grad(piece)  ==  grad(full batch)      (up to rounding)

and the data-parallel gradient is a plain SUM-allreduce (plus the sum over
accumulated micro-batches), with no rescaling afterwards.
"""

from ._backend import array_module, check_float_array, is_cupy


def softmax_cross_entropy(logits, labels, global_batch_size, grad_scale=1.0):
    """Loss and gradient of softmax cross-entropy for one (micro-)batch.

    Parameters
    ----------
    logits : ndarray, shape (batch, n_classes)
        Unnormalised scores (float16 logits are upcast to float32).
    labels : ndarray of int, shape (batch,)
        Class indices in ``[0, n_classes)``, same backend as ``logits``.
    global_batch_size : int
        Number of samples in the whole optimiser step (all ranks, all
        micro-batches); the loss and gradient are divided by it.
    grad_scale : float
        Multiplies the returned gradient (the loss scale of mixed precision).

    Returns
    -------
    loss : 0-d ndarray (float32 or float64)
        ``sum_i -log softmax(logits_i)[labels_i] / global_batch_size`` -- this
        piece's contribution to the global mean loss.
    grad_logits : ndarray, shape (batch, n_classes), dtype of ``logits``
        ``grad_scale * (softmax(logits) - onehot(labels)) / global_batch_size``.
    """
    check_float_array(logits, "logits", ndim=2)
    xp = array_module(logits)
    batch, n_classes = logits.shape
    if labels.shape != (batch,) or labels.dtype.kind not in "iu":
        raise ValueError(
            f"labels: expected integer array of shape ({batch},), found dtype "
            f"{labels.dtype} and shape {tuple(labels.shape)}"
        )
    if int(global_batch_size) < batch:
        raise ValueError(
            f"global_batch_size={global_batch_size} is smaller than this batch ({batch}); "
            "pass the number of samples of the whole step across ranks and micro-batches"
        )
    # Range check on the host only: on a GPU, int(labels.min()) would stall the stream
    # every micro-batch (the loader validates labels once when the data is opened).
    if batch and not is_cupy(labels) and (int(labels.min()) < 0 or int(labels.max()) >= n_classes):
        raise ValueError(
            f"labels: expected values in [0, {n_classes}), found range "
            f"[{int(labels.min())}, {int(labels.max())}]"
        )
    work = logits.astype(xp.float32) if logits.dtype == xp.float16 else logits
    shifted = work - work.max(axis=1, keepdims=True)
    log_normaliser = xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))
    log_probs = shifted - log_normaliser
    rows = xp.arange(batch)
    loss = -log_probs[rows, labels].sum() / global_batch_size
    grad = xp.exp(log_probs)
    grad[rows, labels] -= 1.0
    grad *= grad_scale / global_batch_size
    return loss, grad.astype(logits.dtype, copy=False)


def count_correct(logits, labels):
    """Number of samples whose arg-max logit equals the label (a Python int)."""
    return int((logits.argmax(axis=1) == labels).sum())
