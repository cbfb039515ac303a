from broker.cli import main

main()
