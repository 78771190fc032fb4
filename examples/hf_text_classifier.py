"""A Hugging Face transformers text classifier: `perflab run --workload examples/hf_text_classifier.py`.

A BERT-style encoder built from a small BertConfig with random weights (nothing is downloaded). Dataset
items are `({"input_ids": ..., "attention_mask": ...}, label)`, the shape a tokenizer gives; perflab calls
the model as `model(**inputs)` and the loss reads the ModelOutput's `.logits`. Needs
`pip install 'perflab[models]'`. Its `--option` settings are declared in OPTIONS below.
"""
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

import perflab
from perflab.workloads.settings import ByDevice, resolve_settings, setting

OPTIONS = (  # by device: a few seconds per run on a CPU, a GPU-sized encoder on CUDA
    setting("layers", int, "encoder layers", ByDevice(6, 2), minimum=1),
    setting("hidden", int, "hidden size (a multiple of heads)", ByDevice(512, 64), minimum=1),
    setting("heads", int, "attention heads", ByDevice(8, 2), minimum=1),
    setting("seq_len", int, "tokens per sequence (padding included)", ByDevice(128, 32), minimum=4),
    setting("vocab", int, "vocabulary size", ByDevice(30522, 1000), minimum=2),
    setting("classes", int, "output classes", 4, minimum=2),
)


class RandomSentences(Dataset):
    """Token ids of random length (the rest padding), with their attention masks and a label."""

    def __init__(self, size: int, seq_len: int, vocab: int, classes: int, seed: int):
        gen = torch.Generator().manual_seed(seed)
        self.input_ids = torch.randint(1, vocab, (size, seq_len), generator=gen)
        lengths = torch.randint(seq_len // 4, seq_len + 1, (size, 1), generator=gen)
        self.attention_mask = (torch.arange(seq_len) < lengths).long()
        self.input_ids = self.input_ids * self.attention_mask  # 0 is [PAD]
        self.labels = torch.randint(0, classes, (size,), generator=gen)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        inputs = {"input_ids": self.input_ids[index], "attention_mask": self.attention_mask[index]}
        return inputs, self.labels[index]


def classification_loss(output, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(output.logits, labels)


def build(cfg) -> perflab.Workload:
    try:
        from transformers import BertConfig, BertForSequenceClassification
    except ImportError:
        raise perflab.PerflabError("examples/hf_text_classifier.py needs transformers: "
                                   "pip install 'perflab[models]'") from None
    sizes = resolve_settings(OPTIONS, cfg.workload_options, cfg.device)
    classes = sizes["classes"]
    config = BertConfig(vocab_size=sizes["vocab"], hidden_size=sizes["hidden"],
                        num_hidden_layers=sizes["layers"], num_attention_heads=sizes["heads"],
                        intermediate_size=4 * sizes["hidden"], max_position_embeddings=sizes["seq_len"],
                        num_labels=classes,
                        # SDPA's attention dropout is functional (no nn.Dropout module the quality gate can
                        # switch off), so compiled and eager runs would draw different masks; hidden dropout stays.
                        attention_probs_dropout_prob=0.0)
    return perflab.Workload(
        name="hf-text-classifier",
        model=BertForSequenceClassification(config),
        dataset=RandomSentences(1024, sizes["seq_len"], sizes["vocab"], classes, cfg.seed),
        loss_fn=classification_loss,
        optimizer_factory=lambda params: torch.optim.AdamW(params, lr=1e-4),
        description="BERT-style transformers sequence classifier, random weights, padded token batches",
        uses_attention=True,
        is_classifier=True,
        output_key="logits",
        info=sizes,
    )
