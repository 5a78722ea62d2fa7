"""The paper's comparison as one resumable command: routing modes x depths x seeds (x block counts), each run
pre-trained from scratch through the project's own `finetune`, then scored on held-out documents."""
