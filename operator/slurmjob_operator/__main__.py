from slurmjob_operator.cli import main

raise SystemExit(main())
