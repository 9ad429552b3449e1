"""Where `gptcore.export.model_files` was before gptcore had subpackages (issue 27). Models logged then
load through a loader that imports `gptcore.model_files` by name (`read_model_files`), so the name stays;
new code imports `gptcore.export.model_files`."""

from gptcore.checkpoint.load import (
    checkpoint_model_files as checkpoint_model_files,
)
from gptcore.export.model_files import (
    CONFIG as CONFIG,
)
from gptcore.export.model_files import (
    INT8_WEIGHTS as INT8_WEIGHTS,
)
from gptcore.export.model_files import (
    QUANTIZATION as QUANTIZATION,
)
from gptcore.export.model_files import (
    TOKENIZER as TOKENIZER,
)
from gptcore.export.model_files import (
    WEIGHTS as WEIGHTS,
)
from gptcore.export.model_files import (
    ModelFiles as ModelFiles,
)
from gptcore.export.model_files import (
    model_files_in as model_files_in,
)
from gptcore.export.model_files import (
    read_model_files as read_model_files,
)
from gptcore.export.model_files import (
    write_model_files as write_model_files,
)
