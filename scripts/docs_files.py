"""MkDocs hook: the files a stream consumer needs are served with the site, made at every build from their
one source, so no second copy can drift: `schema/event.schema.json` is the stored payload's JSON Schema as
`ftrain events schema` prints it, and `vectors/…` are the test vectors of `tests/vectors/`, byte for byte.
`docs/event-log.md` links to both (links the strict build checks, since the files are in the build).
"""

from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files, InclusionLevel

VECTORS = Path(__file__).resolve().parent.parent / "tests" / "vectors"
SCHEMA = "schema/event.schema.json"


def on_files(files: Files, config: MkDocsConfig, **_: Any) -> Files:
    """Add the schema and every vector file (`.complete` included: a dot file is served when named here)."""
    from ftrain.events.stored_schema import schema_text

    files.append(
        File.generated(config, SCHEMA, content=schema_text() + "\n", inclusion=InclusionLevel.INCLUDED)
    )
    for path in sorted(p for p in VECTORS.rglob("*") if p.is_file()):
        uri = f"vectors/{path.relative_to(VECTORS).as_posix()}"
        files.append(File.generated(config, uri, abs_src_path=str(path), inclusion=InclusionLevel.INCLUDED))
    return files
