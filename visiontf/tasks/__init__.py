"""The tasks: one package per task (``visiontf.tasks.<task>``: its LightningModule, its inference side, its
data, synthetic set and metrics), over the modules every task shares (``base_task``, ``checkpoints``,
``optim``, ``task_inference``, ``eval_settings``, ``drawing``, ``attention_pictures``, ``task_table``)."""
