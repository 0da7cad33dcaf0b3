"""`python -m tinystack` (also what `torchrun -m tinystack` runs)."""
from tinystack.cli import main

main()
