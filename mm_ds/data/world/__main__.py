"""`python -m mm_ds.data.world --out world --langs t1,t2` (the same as `mm-ds world ...`)."""

from .writer import main

raise SystemExit(main())
