// roomcast: the command-line client (subcommands arrive in the next commit).
print("roomcast 0.1.0")
