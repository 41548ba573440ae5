"""``python -m fr2perfetto``."""

from .cli import main

main()
