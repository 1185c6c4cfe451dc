"""gather_rows: the batched row pick of query selection and post-processing."""
import torch

from visiontf.nn.indexing import gather_rows


def test_gather_rows_equals_advanced_indexing_and_sends_gradients_to_the_picked_rows():
    t = torch.randn(3, 7, 5, dtype=torch.float64, requires_grad=True)
    index = torch.tensor([[6, 0, 6], [2, 3, 4], [1, 1, 0]])
    rows = gather_rows(t, index)
    torch.testing.assert_close(rows, t[torch.arange(3)[:, None], index], rtol=0, atol=0)
    rows.sum().backward()
    counts = torch.zeros(3, 7, dtype=torch.float64).scatter_add_(1, index, torch.ones(3, 3, dtype=torch.float64))
    torch.testing.assert_close(t.grad, counts[..., None].expand(-1, -1, 5), rtol=0, atol=0)


def test_gather_rows_with_no_rows_and_one_channel():
    t = torch.randn(2, 4, 1)
    assert gather_rows(t, torch.zeros(2, 0, dtype=torch.long)).shape == (2, 0, 1)
    torch.testing.assert_close(gather_rows(t, torch.tensor([[3], [0]])), t[[0, 1], [3, 0]][:, None], rtol=0, atol=0)
