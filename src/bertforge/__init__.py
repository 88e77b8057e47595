"""bertforge: BERT (Devlin et al., 2018) as a fast, installable tool.

from bertforge import BertConfig, Tokenizer, BertModel, BertForPreTraining
tok = Tokenizer.from_pretrained(path)
model = BertModel.from_pretrained(path).eval()
out = model(**tok(["a sentence"]))   # out.last_hidden_state (B, T, H), out.pooler_output (B, H)
"""

from .config import BertConfig
from .errors import (
    BertforgeError,
    CheckpointError,
    CheckpointWarning,
    ConfigError,
    DataError,
    FreshWeightsWarning,
    InputError,
    VocabError,
)
from .heads import (
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from .model import BertModel, BertOutput
from .tokenizer import BatchEncoding, Encoding, Tokenizer, train_vocab

__version__ = "0.1.0"

__all__ = [
    "BatchEncoding",
    "BertConfig",
    "BertForMultipleChoice",
    "BertForPreTraining",
    "BertForQuestionAnswering",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertModel",
    "BertOutput",
    "BertforgeError",
    "CheckpointError",
    "CheckpointWarning",
    "ConfigError",
    "DataError",
    "Encoding",
    "FreshWeightsWarning",
    "InputError",
    "Tokenizer",
    "VocabError",
    "__version__",
    "train_vocab",
]
