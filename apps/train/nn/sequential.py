"""Sequential models: layout, binding, forward, backward with a gradient hook.

A :class:`Sequential` owns the :class:`~apps.train.nn.params.ParamLayout` of its
layers (in backward order, see :mod:`apps.train.nn.params`) and binds every layer to
views of two flat buffers::

    model = Sequential([Linear(40, 100), ReLU(), Linear(100, 10)])
    params = xp.asarray(init_flat_parameters(model.layout, seed=0))
    grads = xp.zeros_like(params)
    model.bind(params, grads)
    logits = model.forward(x, ForwardContext(training=True, sample_index=ids))
    grads.fill(0)
    model.backward(grad_logits, on_grads_ready=bucket_launcher)

Backward walks the layers in reverse and, after a layer's parameter gradients are
final, calls ``on_grads_ready(lo, hi)`` with that layer's slice of the flat
gradient buffer. Because the layout is in backward order, the reported slices tile
``[0, n_params)`` from low to high offsets -- the data-parallel bucket launcher
starts an allreduce whenever a bucket is complete, overlapping communication with
the rest of backward. With gradient accumulation, pass the hook only on the last
micro-batch (the gradients of earlier micro-batches are not final).

Activation recomputation
------------------------
With ``recompute=True`` the forward pass keeps only the input of each *block* and
drops every layer's saved activations; backward re-runs the block's forward just
before differentiating it. The recomputation performs exactly the same operations
on exactly the same inputs (dropout masks are hashes, not RNG draws), so the
gradients are bitwise identical to the stored-activation run. By default a block
is a layer with parameters followed by the parameter-free layers after it
(``Linear, GELU, Dropout``); pass ``block_sizes`` to choose differently.
"""

from apps.train.kernels.buffers import add
from .dropout import Dropout
from .layers import BIAS_FOLDING_LAYERS, GELU, Layer, LayerNorm, Linear
from .params import ParamLayout


class Residual(Layer):
    """``y = x + f(x)`` for an inner list of layers ``f`` (shapes must match).

    Its parameters are those of its inner layers, contiguous in the layout; the
    enclosing model reports them to the gradient hook as one range.
    """

    def __init__(self, layers):
        super().__init__()
        self.layers = list(layers)

    def leaves(self):
        return [leaf for layer in self.layers for leaf in layer.leaves()]

    def assign_names(self, prefix):
        self.name = f"{prefix}Residual"
        for index, layer in enumerate(self.layers):
            layer.assign_names(f"{self.name}/{index}.")

    def bind(self, param_views, grad_views):
        for layer in self.layers:
            layer.bind(param_views, grad_views)

    def forward(self, x, ctx):
        h = x
        for layer in self.layers:
            h = layer.forward(h, ctx)
        if h.shape != x.shape:
            raise ValueError(
                f"{self.name}: the inner layers map shape {tuple(x.shape)} to "
                f"{tuple(h.shape)}; a residual branch must preserve the shape"
            )
        return add(x, h)   # GPU bfloat16 bit patterns need a numeric, not an integer, sum

    def backward(self, grad_out):
        grad = grad_out
        for layer in reversed(self.layers):
            grad = layer.backward(grad)
        return add(grad_out, grad)

    def release(self):
        for layer in self.layers:
            layer.release()

    def __repr__(self):
        return f"Residual({self.layers!r})"


class Sequential:
    """A chain of layers with a flat parameter layout.

    Parameters
    ----------
    layers : list of Layer
    block_sizes : list of int, optional
        Number of top-level layers per recomputation block (must sum to
        ``len(layers)``). Default: each layer with parameters starts a block
        (parameter-free layers before the first one join it).
    recompute : bool
        Activation recomputation (see module docstring); may be toggled later
        through the attribute of the same name.

    Attributes
    ----------
    layout : ParamLayout
        Flat layout, last layer first.
    n_params : int
    """

    def __init__(self, layers, block_sizes=None, recompute=False):
        self.layers = list(layers)
        if not self.layers:
            raise ValueError("Sequential: expected at least one layer, found none")
        for index, layer in enumerate(self.layers):
            if not isinstance(layer, Layer):
                raise TypeError(
                    f"Sequential: layer {index} is a {type(layer).__name__}, expected an "
                    "apps.train Layer"
                )
            layer.assign_names(f"{index}.")
        self.recompute = bool(recompute)
        self._fold_biases()
        self._fuse_activations()
        self.blocks = self._make_blocks(block_sizes)
        self._number_dropout_streams()
        self.layout = self._build_layout()
        self.n_params = self.layout.n_params
        self._block_inputs = None
        self._ctx = None

    # -- structure ---------------------------------------------------------
    def leaves(self):
        return [leaf for layer in self.layers for leaf in layer.leaves()]

    def _make_blocks(self, block_sizes):
        if block_sizes is None:
            blocks, current, current_has_params = [], [], False
            for layer in self.layers:
                has_params = any(leaf.param_specs() for leaf in layer.leaves())
                # leading parameter-free layers (Reshape) join the first block
                if has_params and current_has_params:
                    blocks.append(current)
                    current, current_has_params = [], False
                current.append(layer)
                current_has_params = current_has_params or has_params
            blocks.append(current)
            return blocks
        if sum(block_sizes) != len(self.layers) or min(block_sizes) < 1:
            raise ValueError(
                f"block_sizes {list(block_sizes)} must be positive and sum to the number "
                f"of layers ({len(self.layers)})"
            )
        blocks, start = [], 0
        for size in block_sizes:
            blocks.append(self.layers[start:start + size])
            start += size
        return blocks

    def _fold_biases(self):
        """A Linear followed by a LayerNorm or GELU leaves its bias to that layer's kernel."""
        for layer, following in zip(self.layers, self.layers[1:]):
            if (isinstance(layer, Linear) and layer.use_bias
                    and isinstance(following, BIAS_FOLDING_LAYERS)):
                layer.defer_bias = True
                following.bias_source = layer

    def _fuse_activations(self):
        """A LayerNorm followed by a GELU computes the activation in its own kernels."""
        for layer, following in zip(self.layers, self.layers[1:]):
            if isinstance(layer, LayerNorm) and type(following) is GELU:
                layer.activation = "gelu"
                following.fused_into = layer

    def _number_dropout_streams(self):
        used = {leaf.stream for leaf in self.leaves() if isinstance(leaf, Dropout)}
        next_stream = 1
        for leaf in self.leaves():
            if isinstance(leaf, Dropout) and leaf.stream is None:
                while next_stream in used:
                    next_stream += 1
                leaf.stream = next_stream
                used.add(next_stream)

    def _build_layout(self):
        layout = ParamLayout()
        for layer in reversed(self.layers):
            lo = layout.n_params
            for leaf in reversed(layer.leaves()):
                leaf.param_range = layout.add_layer(leaf.name, leaf.param_specs())
            layer.param_range = (lo, layout.n_params)
        return layout

    def bind(self, params, grads):
        """Point every layer at views of the flat ``params`` and ``grads`` buffers.

        Parameters
        ----------
        params, grads : ndarray, shape (n_params,)
            Same dtype and backend; they are used in place, never copied.
        """
        if params.shape != grads.shape or params.dtype != grads.dtype:
            raise ValueError(
                f"bind: params {params.dtype}{tuple(params.shape)} and grads "
                f"{grads.dtype}{tuple(grads.shape)} must have the same shape and dtype"
            )
        param_views = self.layout.views(params)
        grad_views = self.layout.views(grads)
        for layer in self.layers:
            layer.bind(param_views, grad_views)
        self.params = params
        self.grads = grads

    # -- computation -------------------------------------------------------
    def forward(self, x, ctx):
        """Run the layers; returns the output (logits for a classifier)."""
        recompute = self.recompute and ctx.training
        self._ctx = ctx
        self._block_inputs = [] if recompute else None
        for block in self.blocks:
            if recompute:
                self._block_inputs.append(x)
            for layer in block:
                x = layer.forward(x, ctx)
            if recompute:
                for layer in block:
                    layer.release()
        return x

    def backward(self, grad_out, on_grads_ready=None, need_input_grad=True):
        """Backpropagate ``grad_out``; parameter gradients are ADDED to ``grads``.

        Parameters
        ----------
        grad_out : ndarray
            Gradient of the loss with respect to the model output.
        on_grads_ready : callable(lo, hi), optional
            Called after each layer with parameters, with the slice of the flat
            gradient buffer that is now final. Slices come in increasing order.
        need_input_grad : bool
            False: a first :class:`~apps.train.nn.layers.Linear` layer skips the
            gradient with respect to the data (one GEMM the trainer never uses)
            and None may be returned.

        Returns
        -------
        ndarray or None
            Gradient with respect to the model input.
        """
        grad = grad_out
        first_layer = self.layers[0]
        for block_index in reversed(range(len(self.blocks))):
            block = self.blocks[block_index]
            if self._block_inputs is not None:
                x = self._block_inputs[block_index]
                self._block_inputs[block_index] = None   # freed as backward passes it, like saved activations
                for layer in block:
                    x = layer.forward(x, self._ctx)
                x = None   # the block's output: its gradient is ``grad``, the value is not needed
            for layer in reversed(block):
                if layer is first_layer and not need_input_grad and isinstance(layer, Linear):
                    grad = layer.backward(grad, need_input_grad=False)
                else:
                    grad = layer.backward(grad)
                layer.release()
                if on_grads_ready is not None and layer.n_params:
                    on_grads_ready(*layer.param_range)
        self._block_inputs = None
        return grad

    def saved_activation_bytes(self):
        """Bytes of the arrays held for backward now: every layer's saved activations and, with
        recomputation, the block inputs; a buffer referenced twice (a layer's saved input that is
        also a block input, or a view of it) counts once. Between ``forward`` and ``backward`` of a
        training step this is the activation memory that recomputation trades for compute.

        Returns
        -------
        int
            Bytes (NumPy or CuPy arrays, any dtype).
        """
        def root(array):
            while getattr(array, "base", None) is not None:
                array = array.base
            return array

        held = [value for leaf in self.leaves() for value in leaf.saved_state().values()]
        held += list(self._block_inputs or ())
        parameters = {id(root(buffer)) for buffer in (getattr(self, "params", None), getattr(self, "grads", None))
                      if buffer is not None}
        buffers = {}
        for value in held:
            if not hasattr(value, "nbytes") or not hasattr(value, "dtype"):
                continue   # shapes, tuples, None
            base = root(value)
            if id(base) not in parameters:   # a bias kept for backward is a parameter, not an activation
                buffers[id(base)] = int(base.nbytes)
        return sum(buffers.values())

    def __repr__(self):
        inner = ",\n    ".join(repr(layer) for layer in self.layers)
        return f"Sequential([\n    {inner}\n], n_params={self.n_params})"
