from .cli.app import main

if __name__ == "__main__":   # importing the package (the docs build does) runs nothing
    main()
