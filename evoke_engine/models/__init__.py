"""Models beyond the embedded one: the curated catalogue, the Hugging Face hub (search, file lists with sha256)
and verified, resumable downloads into the app's models folder. No Qt here; the window and the CLI call in.

Invariant: nothing in this package loads a model or touches the engine; a file it writes under the models folder
is either a verified .gguf in place or a partial under the hidden `.partial/` folder, never a half file in view.
"""

from .catalogue import Catalogue, CatalogueModel, LocalModel, Quant, load_catalogue, local_models, models_dir
from .download import DownloadProgress, PulledModel, download_file, pull
from .errors import (
    CatalogueError,
    ChecksumMismatchError,
    DiskSpaceError,
    DownloadCancelled,
    DownloadInterruptedError,
    HubNotFoundError,
    HubUnreachableError,
    ModelHubError,
)
from .hub import HubFile, HubRepo, PullSpec, RepoListing, list_gguf_files, parse_spec, search_gguf

__all__ = ["Catalogue", "CatalogueError", "CatalogueModel", "ChecksumMismatchError", "DiskSpaceError",
           "DownloadCancelled", "DownloadInterruptedError", "DownloadProgress", "HubFile", "HubNotFoundError",
           "HubRepo", "HubUnreachableError", "LocalModel", "ModelHubError", "PullSpec", "PulledModel", "Quant",
           "RepoListing", "download_file", "list_gguf_files", "load_catalogue", "local_models", "models_dir",
           "parse_spec", "pull", "search_gguf"]
