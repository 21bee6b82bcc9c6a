import RoomcastServer
print("roomcastd")
