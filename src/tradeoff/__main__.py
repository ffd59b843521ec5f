from tradeoff.cli import main

main()
