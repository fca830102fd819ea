"""Boxes: the C copies and the numpy fallback against plain indexing, for both dtypes."""

import numpy as np
import pytest
import torch

from odecli.parallel import strips
from odecli.parallel.strips import Boxes

SHAPE = (2, 3, 11, 13)  # two leading (batch) dimensions
BOXES = [(0, (..., slice(2, 9), slice(0, 3))), (1, (..., slice(0, 2), slice(None))),
         (0, (..., slice(9, 11), slice(8, 13))), (1, (..., slice(4, 5), slice(6, 7)))]


def _expected_buffer(fields):
    """Batch by batch, box by box, row by row (the message layout both ranks agree on)."""
    out = []
    for b in np.ndindex(*SHAPE[:-2]):
        for field, index in BOXES:
            out.append(fields[field][b][index[1:]].reshape(-1))
    return torch.cat(out)


def _fields(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(SHAPE, generator=g, dtype=dtype) for _ in range(2)]


@pytest.fixture(params=["native", "numpy", "torch"])
def make(request, monkeypatch):
    if request.param == "native":
        if strips._library() is None:
            pytest.fail("the C copies did not build on this machine")
        return lambda dtype: Boxes(SHAPE, dtype, BOXES)
    if request.param == "torch":  # the path GPU fields take, run here on CPU tensors
        monkeypatch.setattr(strips, "_on_host", lambda fields: False)

    def numpy_boxes(dtype):
        boxes = Boxes(SHAPE, dtype, BOXES)
        boxes._c = None  # the reference path, as without a compiler
        return boxes
    return numpy_boxes


def _cleared(fields):
    out = [f.clone() for f in fields]
    for field, index in BOXES:
        out[field][index] = 0
    return out


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("clear", [False, True])
def test_pack_matches_indexing(make, dtype, clear):
    fields = _fields(dtype)
    before = [f.clone() for f in fields]
    buf = make(dtype).pack(fields, clear=clear)
    assert torch.equal(torch.from_numpy(buf.copy()), _expected_buffer(before))
    for f, e in zip(fields, _cleared(before) if clear else before):
        assert torch.equal(f, e)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("mode", ["copy", "add", "subtract"])
def test_unpack_matches_indexing(make, dtype, mode):
    boxes = make(dtype)
    fields = _fields(dtype)
    expected = [f.clone() for f in fields]
    message = torch.randn(boxes.buffer.size, dtype=dtype)
    boxes.buffer[:] = message.numpy()
    boxes.unpack(fields, mode)
    at = 0
    for b in np.ndindex(*SHAPE[:-2]):
        for field, index in BOXES:
            view = expected[field][b][index[1:]]
            part = message[at : at + view.numel()].reshape(view.shape)
            at += view.numel()
            view.copy_(part if mode == "copy" else view + part if mode == "add" else view - part)
    for f, e in zip(fields, expected):
        assert torch.equal(f, e)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("subtract", [False, True])
def test_move_matches_indexing(make, dtype, weighted, subtract):
    boxes = make(dtype)
    dst, src = _fields(dtype)
    weight = torch.rand(SHAPE[-2:], dtype=dtype) if weighted else None
    want_dst, want_src = dst.clone(), src.clone()
    for _, index in BOXES:
        if subtract:
            want_dst[index] -= src[index]
        else:
            want_dst[index] = src[index] * (1 if weight is None else weight[index[1:]])
        want_src[index] = 0
    boxes.move(dst, src, None if weight is None else weight.numpy(), subtract=subtract)
    assert torch.equal(dst, want_dst) and torch.equal(src, want_src)


def test_non_contiguous_fields_take_the_numpy_path():
    """A transposed view must be copied by its strides, not as raw contiguous memory."""
    boxes = Boxes(SHAPE, torch.float64, BOXES)
    base = [torch.randn(SHAPE[:-2] + SHAPE[-2:][::-1], dtype=torch.float64) for _ in range(2)]
    views = [b.transpose(-1, -2) for b in base]
    assert not views[0].is_contiguous()
    before = [v.clone() for v in views]
    buf = boxes.pack(views, clear=True)
    assert torch.equal(torch.from_numpy(buf.copy()), _expected_buffer(before))
    for v, e in zip(views, _cleared(before)):
        assert torch.equal(v, e)
    boxes.unpack(views, "add")
    for v, e in zip(views, before):  # the cleared boxes get their values back
        assert torch.equal(v, e)


def test_bad_use_is_refused():
    boxes = Boxes(SHAPE, torch.float64, BOXES)
    with pytest.raises(ValueError, match="shape"):
        boxes.pack([torch.zeros(2, 3, 11, 12, dtype=torch.float64)] * 2)
    with pytest.raises(ValueError, match="float64"):
        boxes.pack([torch.zeros(SHAPE, dtype=torch.float32)] * 2)
    with pytest.raises(ValueError, match="2 fields"):
        boxes.pack([torch.zeros(SHAPE, dtype=torch.float64)])
    with pytest.raises(ValueError, match="mode"):
        boxes.unpack([torch.zeros(SHAPE, dtype=torch.float64)] * 2, "multiply")
    with pytest.raises(ValueError, match="weight"):
        boxes.move(*_fields(torch.float64), weight=np.ones((3, 3)))
    with pytest.raises(ValueError, match="box"):
        Boxes(SHAPE, torch.float64, [(0, (..., slice(3, 3), slice(0, 2)))])
    with pytest.raises(TypeError, match="float32 or float64"):
        Boxes(SHAPE, torch.int64, BOXES)
