"""The Paddle-style front door: ``import sampan as paddle``, tensor creation, ``sampan.nn`` names."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sampan
import sampan as paddle


class MyNet(paddle.nn.Layer):
    """The Paddle quickstart model, written exactly as a Paddle user would."""

    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(784, 10)

    def forward(self, x):
        return self.fc(x)


def test_paddle_quickstart_runs_as_written():
    paddle.seed(0)
    model = MyNet()
    x = paddle.randn([64, 784])
    out = model(x)
    assert list(out.shape) == [64, 10]
    assert out.dtype == torch.float32
    assert isinstance(model, torch.nn.Module)
    assert isinstance(model, sampan.nn.Layer)
    torch.testing.assert_close(out, x @ model.fc.weight.T + model.fc.bias, rtol=1e-5, atol=1e-5)
    # It trains like any torch module.
    out.sum().backward()
    assert model.fc.weight.grad is not None and model.fc.weight.grad.shape == (10, 784)


def test_nn_names_resolve_to_torch():
    assert sampan.nn.Linear is torch.nn.Linear
    assert sampan.nn.LayerNorm is torch.nn.LayerNorm
    assert sampan.nn.Embedding is torch.nn.Embedding
    assert sampan.nn.Dropout is torch.nn.Dropout
    assert sampan.nn.functional is torch.nn.functional
    assert issubclass(sampan.nn.Layer, torch.nn.Module)


def test_missing_names_raise_attribute_error():
    with pytest.raises(AttributeError, match="NoSuchLayer"):
        _ = sampan.nn.NoSuchLayer
    with pytest.raises(AttributeError, match="no_such_thing"):
        _ = sampan.no_such_thing


def test_lazy_subpackages_are_modules():
    import sampan.models
    import sampan.optimizer

    assert paddle.models is sampan.models
    assert paddle.optimizer is sampan.optimizer


@pytest.mark.parametrize("shape, expected", [([2, 3], (2, 3)), ((4,), (4,)), (5, (5,)), ([], ()),
                                              (torch.Size([1, 2]), (1, 2)), ([0, 3], (0, 3))])
def test_creation_shapes(shape, expected):
    for make in (sampan.zeros, sampan.ones, sampan.randn, sampan.rand):
        assert tuple(make(shape).shape) == expected
    assert tuple(sampan.full(shape, 7.0).shape) == expected


def test_creation_values_and_dtypes():
    assert torch.equal(sampan.zeros([2, 2]), torch.zeros(2, 2))
    assert torch.equal(sampan.ones([3], dtype="int64"), torch.ones(3, dtype=torch.int64))
    full = sampan.full([2, 3], 2.5, dtype="float64")
    assert full.dtype == torch.float64 and bool((full == 2.5).all())
    assert sampan.zeros([1], dtype="bf16").dtype == torch.bfloat16
    assert sampan.zeros([1], dtype="float16").dtype == torch.float16
    assert sampan.zeros([1], dtype="bool").dtype == torch.bool
    assert sampan.zeros([1], dtype=torch.int32).dtype == torch.int32
    assert sampan.randn([4]).dtype == torch.float32
    r = sampan.rand([1000])
    assert float(r.min()) >= 0.0 and float(r.max()) < 1.0


def test_arange():
    assert sampan.arange(5).tolist() == [0, 1, 2, 3, 4]
    assert sampan.arange(2, 8, 2).tolist() == [2, 4, 6]
    assert sampan.arange(0, 1, 0.25, dtype="float64").tolist() == [0.0, 0.25, 0.5, 0.75]


def test_randint_range_and_errors():
    x = sampan.randint(5, shape=[2000])
    assert x.dtype == torch.int64
    assert set(x.tolist()) == {0, 1, 2, 3, 4}
    y = sampan.randint(-3, 3, shape=[10, 10], dtype="int32")
    assert y.dtype == torch.int32 and int(y.min()) >= -3 and int(y.max()) < 3
    with pytest.raises(ValueError, match="high > low"):
        sampan.randint(3, 3, shape=[2])
    with pytest.raises(ValueError, match="high > low"):
        sampan.randint(0, shape=[2])


def test_seed_makes_randn_repeatable():
    sampan.seed(123)
    a = sampan.randn([3, 4])
    sampan.manual_seed(123)
    b = sampan.randn([3, 4])
    assert torch.equal(a, b)
    sampan.seed(124)
    assert not torch.equal(a, sampan.randn([3, 4]))


@pytest.mark.parametrize("bad", ["float33", "int", "Float32", 3])
def test_bad_dtype_is_value_error_listing_choices(bad):
    with pytest.raises(ValueError, match="float32"):
        sampan.zeros([2], dtype=bad)


@pytest.mark.parametrize("shape", [[2, -1], (-1,), -3, torch.tensor([2, -1])])
def test_negative_shape_is_value_error(shape):
    # An int or tensor shape must get the same clear error as a list shape.
    with pytest.raises(ValueError, match="negative"):
        sampan.zeros(shape)


def test_to_tensor():
    t = sampan.to_tensor([[1, 2], [3, 4]])
    assert t.dtype == torch.int64 and t.tolist() == [[1, 2], [3, 4]]
    assert not t.requires_grad
    f = sampan.to_tensor([1.0, 2.0])
    assert f.dtype == torch.float32
    assert sampan.to_tensor([1, 2], dtype="float64").dtype == torch.float64
    n = sampan.to_tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert n.shape == (2, 3) and n.dtype == torch.float32
    assert sampan.to_tensor(3.5).dim() == 0


def test_to_tensor_stop_gradient_false_makes_trainable_leaf():
    x = sampan.to_tensor([1.0, 2.0, 3.0], stop_gradient=False)
    assert x.requires_grad and x.is_leaf
    (x * x).sum().backward()
    assert x.grad.tolist() == [2.0, 4.0, 6.0]
    with pytest.raises(ValueError, match="floating"):
        sampan.to_tensor([1, 2], stop_gradient=False)


def test_to_tensor_copies_a_tensor():
    src = torch.ones(3, requires_grad=True)
    out = sampan.to_tensor(src)
    assert not out.requires_grad
    with torch.no_grad():
        src.add_(1.0)
    assert out.tolist() == [1.0, 1.0, 1.0]


def test_concat_and_stack():
    a, b = torch.zeros(2, 3), torch.ones(2, 3)
    assert sampan.concat([a, b]).shape == (4, 3)
    assert sampan.concat([a, b], axis=1).shape == (2, 6)
    assert sampan.stack([a, b], axis=1).shape == (2, 2, 3)
    assert torch.equal(sampan.stack([a, b])[1], b)


def test_default_dtype_roundtrip():
    assert sampan.get_default_dtype() == torch.float32
    try:
        sampan.set_default_dtype("float64")
        assert sampan.get_default_dtype() == torch.float64
        assert sampan.randn([2]).dtype == torch.float64
    finally:
        sampan.set_default_dtype("float32")
    assert torch.get_default_dtype() == torch.float32


def test_no_grad():
    x = sampan.to_tensor([1.0], stop_gradient=False)
    with sampan.no_grad():
        y = x * 2
    assert not y.requires_grad
