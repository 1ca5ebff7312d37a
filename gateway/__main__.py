from gateway.cli import main

raise SystemExit(main())
