from symfield.cli.main import main

raise SystemExit(main())
