"""Model zoo: the MNIST-1D baselines and a configurable large MLP.

The MNIST-1D models reproduce the baselines of Greydanus (2020), "Scaling down
deep learning", as defined in the reference implementation's ``models.py``
(github.com/greydanus/mnist1d): inputs are 40-sample signals, 10 classes.

* MLP (reported ~68 % test accuracy): ``Linear(40, 100) -> ReLU`` then a residual
  ``h + ReLU(Linear(100, 100)(h))`` and ``Linear(100, 10)``; 15,210 parameters.
* CNN (reported ~94 %): three ``Conv1d`` layers with 25 channels (kernel 5/3/3,
  stride 2, padding 1; length 40 -> 19 -> 10 -> 5), ReLU after each, flatten
  (125) and ``Linear(125, 10)``; 5,210 parameters.

Parameters are initialised like PyTorch's defaults (uniform in +-1/sqrt(fan_in)).
With the app's default recipes they reach about 71 % and 95 % (means over seeds, docs/train.md).
"""

from .conv import Conv1d
from .dropout import Dropout
from .layers import GELU, Flatten, LayerNorm, Linear, ReLU, Reshape
from .sequential import Residual, Sequential

MNIST1D_LENGTH = 40
MNIST1D_CLASSES = 10


def mnist1d_mlp(hidden_size=100, n_inputs=MNIST1D_LENGTH, n_classes=MNIST1D_CLASSES,
                recompute=False):
    """The MNIST-1D MLP baseline (see module docstring)."""
    return Sequential([
        Linear(n_inputs, hidden_size),
        ReLU(),
        Residual([Linear(hidden_size, hidden_size), ReLU()]),
        Linear(hidden_size, n_classes),
    ], recompute=recompute)


def mnist1d_cnn(channels=25, n_inputs=MNIST1D_LENGTH, n_classes=MNIST1D_CLASSES,
                recompute=False):
    """The MNIST-1D CNN baseline (see module docstring)."""
    length = n_inputs
    layers = [Reshape((1, n_inputs))]
    in_channels = 1
    for kernel_size in (5, 3, 3):
        conv = Conv1d(in_channels, channels, kernel_size, stride=2, padding=1)
        length = conv.output_length(length)
        layers += [conv, ReLU()]
        in_channels = channels
    layers += [Flatten(), Linear(channels * length, n_classes)]
    return Sequential(layers, recompute=recompute)


def large_mlp(n_inputs, n_classes, depth, width, activation="gelu", layer_norm=True,
              dropout=0.0, recompute=False):
    """A deep MLP for benchmarks and scaling tests.

    ``Linear(n_inputs, width)`` followed by ``depth`` hidden blocks
    ``[LayerNorm] -> activation -> [Dropout] -> Linear(width, width)`` and a final
    ``activation -> Linear(width, n_classes)``. Parameter count is about
    ``depth * width**2``.

    Parameters
    ----------
    depth : int
        Number of hidden ``width x width`` layers (>= 0).
    width : int
    activation : {"gelu", "relu"}
    layer_norm : bool
    dropout : float
        Drop probability in each hidden block (0 disables the layer).
    recompute : bool
        Activation recomputation, one block per hidden layer (``[LayerNorm] -> activation ->
        [Dropout] -> Linear``, the input Linear alone, the final ``activation -> Linear`` together):
        between forward and backward only each block's input is held, one ``batch x width`` array
        per hidden layer instead of two (``benchmarks/train_recompute_memory.py``).
    """
    if depth < 0 or width < 1:
        raise ValueError(f"large_mlp: expected depth >= 0 and width >= 1, found {depth}, {width}")
    if activation not in ("gelu", "relu"):
        raise ValueError(f"large_mlp: activation must be 'gelu' or 'relu', found {activation!r}")
    make_activation = GELU if activation == "gelu" else ReLU
    layers = [Linear(n_inputs, width)]
    for _ in range(depth):
        if layer_norm:
            layers.append(LayerNorm(width))
        layers.append(make_activation())
        if dropout > 0.0:
            layers.append(Dropout(dropout))
        layers.append(Linear(width, width))
    layers += [make_activation(), Linear(width, n_classes)]
    hidden_block = int(layer_norm) + 1 + int(dropout > 0.0) + 1
    return Sequential(layers, block_sizes=[1] + [hidden_block] * depth + [2], recompute=recompute)


MODELS = {"mlp": mnist1d_mlp, "cnn": mnist1d_cnn}
