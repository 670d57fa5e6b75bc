"""The `rcpflow` command line (`commands.main`): its commands, `rcpflow status`, and the hints a
command gives when handed the wrong kind of path.
"""
