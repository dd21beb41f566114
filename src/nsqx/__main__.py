from nsqx.cli.main import main

raise SystemExit(main())
