"""Training: optimizer and schedule, the one training loop, checkpoints, distributed helpers;
the supervised machinery fine-tuning and distillation share (supervised.py), and the commands
pretrain, finetune and distill."""
