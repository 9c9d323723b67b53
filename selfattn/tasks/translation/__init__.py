"""Translation: Multi30k (`multi30k`), SentencePiece subwords
(`tokenizer`), sacreBLEU scores (`bleu`), token arrays (`data`), the task
(`task`), length-bucketed batches (`batches`) and beam-search translation
(`translate`)."""

from selfattn.tasks.translation.task import TRANSLATION_TASKS
