"""Each read row's mean code and error over a data set (`concepts.analysis.means`): a circuit's mean baseline."""
import pytest
import torch

from vitviz.concepts import ConceptsError
from vitviz.concepts.analysis.means import load_means, row_means, save_means
from vitviz.concepts.kinds.topk import TopK


def test_row_means_are_each_rows_mean_over_the_images_and_round_trip(tmp_path):
    torch.manual_seed(0)
    dictionary = TopK(6, 12, k=3)
    with torch.no_grad():
        for parameter in dictionary.parameters():
            parameter.normal_()
    grids = [torch.randn(4, 5, 6), torch.randn(3, 5, 6)]   # two batches of images, 5 rows each
    means = row_means(dictionary, grids)
    every = torch.cat(grids)
    codes = dictionary.encode(every)
    torch.testing.assert_close(means.codes, codes.mean(0))
    torch.testing.assert_close(means.error, (every - dictionary.decode(codes)).mean(0))
    assert means.images == 7 and means.codes.shape == (5, 12) and means.error.shape == (5, 6)
    again = load_means(save_means(means, tmp_path / "means.safetensors"), dictionary)
    assert torch.equal(again.codes, means.codes) and torch.equal(again.error, means.error) and again.images == 7
    with pytest.raises(ConceptsError, match="not this dictionary's"):
        load_means(tmp_path / "means.safetensors", TopK(6, 10, k=3))
    (tmp_path / "broken.safetensors").write_bytes(b"not a file")
    with pytest.raises(ConceptsError, match="cannot be read"):
        load_means(tmp_path / "broken.safetensors", dictionary)
    with pytest.raises(ConceptsError, match="no activations"):
        row_means(dictionary, [])
