"""The measured lines of ``local_cpu_calibration.py``, one module each (the script prints the
table; its docstring has the formulas)."""
