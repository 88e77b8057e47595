"""Data: corpora, pre-training instances, task readers. Never imports training code."""
