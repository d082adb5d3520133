"""A `tpu-fc run` script's top level in a multiprocessing child.

multiprocessing's spawn and forkserver start methods run the parent's main
script again in each child (as `__mp_main__`), in a fresh interpreter where
`tpu-fc run` never bound the legacy names: `legacy_names.run_script` has them
run this module instead, which binds the names and then runs the script.
"""
import os

from tpu_fc import __main__ as command_line

command_line.this_package()  # (the child's working directory is the parent's)
from tpu_fc import legacy_names  # pylint: disable=g-import-not-at-top,wrong-import-position

legacy_names.install()
globals().update(legacy_names.run_script(os.environ[legacy_names.RUN_SCRIPT_ENV],
                                      run_name=__name__))
