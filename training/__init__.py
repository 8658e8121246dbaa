"""Training and evaluation of the project's reward models and value heads (not needed at run time).

Each module but ``pairs`` (the preference pairs the training scripts share) is a command,
``python -m training.<module> --data DIR``; DIR holds the public preference data named in the model cards under
``sbon/assets/``.
"""
