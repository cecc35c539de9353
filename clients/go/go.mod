module github.com/inboxd/inboxd/clients/go

go 1.19
