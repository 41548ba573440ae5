"""Read: from what the inputs name to a ``Job``. ``inputs`` finds the files (folders, archives, globs)
and sorts them by kind; ``reader`` reads one dump into ``columns``: a pickle in one C pass over its
opcodes, anything else by the reference reader (through ``safe_pickle``, which refuses anything but
plain data, and ``pickle_shape``, which bounds what a pickle may build); ``job.load_job`` reads them all,
with the stack snapshots (``stacks``) and logs (``logs``) beside them, and ``redact`` for sharing."""
