"""Not doing the task: import the reference module and call its Model.

Defence: the import hook of the candidate worker (sandbox.integrity.install_import_hook): violation "import".
"""
import torch.nn as nn

from model import Model


class ModelNew(Model):
    pass
