"""pyzlog.client"""
